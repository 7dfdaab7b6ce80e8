"""A search on a 3-node Ray cluster simulated on this machine; run by `test_cluster.py` in a process
of its own (a process joins one Ray cluster; the test session has its own local Ray).

    python -m tests.search.cluster_run DATABASE_URL OUT_DIR

The cluster (`ray.cluster_utils.Cluster`): a head with 1 CPU and no GPU, and two nodes with 1 CPU
and 1 GPU each. Ray schedules by declared resources, so the two "GPUs" stand in for accelerators
on a machine that has none: a trial asking for one waits for a free one. The stand-in evaluation
records the node it ran on and when it started and ended (files in OUT_DIR, which every node
shares on this machine; its workers find it in `$CLUSTER_RUN_OUT`) and trains nothing.

Two searches of one study each, through `run_search` joining the cluster by address:
- "cpu": 3 workers of 1 CPU; each trial waits (up to a minute) until 3 trials have started, so
  the 3 running at once hold the 3 CPUs: one on each node, whatever the timing.
- "gpu": 3 workers of 1 CPU and 1 GPU for 4 trials: at most 2 can run at once, on the GPU nodes;
  the first two wait for each other, so 2 do run at once while the third is queued.

Prints one JSON object: the node ids by role, each trial's (search, number, node, start, end).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import ray

from archsearch.trial import TrialOutcome

# Every Ray worker on the 3 nodes imports this module to run `stand_in`: what only `main` needs
# (the driver, the storage, the spec's parser: seconds of a loaded CPU per worker) is imported there.

MODEL = """vocab_size = 256
seq_len = 32
head_dim = 32
d_model = [64, 128, 192, 256]
aspect_ratio = [16, 32, 64]
activation = ["gelu", "swiglu"]"""  # 24 shapes: 7 random samples rarely repeat one
BARRIER_S = 60.0  # how long a "cpu" trial waits for the others to start


def stand_in(request, known=None, board=None):
    """The Ray task: note where and when it ran; a "cpu" trial waits for 3 to have started."""
    out = Path(os.environ["CLUSTER_RUN_OUT"])  # the nodes' processes inherit the script's
    search = "gpu" if ray.get_gpu_ids() else "cpu"
    started = time.time()
    mark = out / f"{search}-{request.number}.json"
    mark.write_text(json.dumps({"start": started}))
    if search == "cpu":
        deadline = time.monotonic() + BARRIER_S
        while len(list(out.glob("cpu-*.json"))) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
    else:  # two GPU trials run at once, then hold their GPUs a while: a third must wait
        deadline = time.monotonic() + BARRIER_S
        while len(list(out.glob("gpu-*.json"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)
    node = ray.get_runtime_context().get_node_id()
    mark.write_text(json.dumps({"search": search, "number": request.number, "node": node,
                                "start": started, "end": time.time()}))  # fmt: skip
    loss = 1.0 + request.config.d_model / 1000 + request.config.n_layers / 100
    return TrialOutcome(status="complete", train={"val_loss": loss, "tokens": 1, "val_curve": [[1, loss]]})


def main(url: str, out: Path) -> None:
    from ray.cluster_utils import Cluster

    from archsearch.search.driver import SearchOptions, run_search
    from archsearch.storage import Storage
    from tests.specs import tiny_spec

    os.environ["CLUSTER_RUN_OUT"] = str(out)
    # No dashboard: nothing here reads it, and its start is seconds of CPU on the head.
    head = {"num_cpus": 1, "num_gpus": 0, "include_dashboard": False}
    cluster = Cluster(initialize_head=True, head_node_args=head)
    gpu_nodes = [cluster.add_node(num_cpus=1, num_gpus=1) for _ in range(2)]
    cluster.wait_for_nodes()
    try:
        spec = tiny_spec(model=MODEL)
        with Storage.open(url) as db:
            for name, trials, gpus in (("cpu", 3, 0.0), ("gpu", 4, 1.0)):
                options = SearchOptions(
                    study=name, trials=trials, workers=3, sampler="random", address=cluster.address,
                    gpus_per_trial=gpus,
                )  # fmt: skip
                run_search(spec, db, options, evaluate_fn=stand_in)
            counts = {name: db.counts(name) for name in ("cpu", "gpu")}
        nodes = {"head": cluster.head_node.node_id, "gpu_nodes": [n.node_id for n in gpu_nodes]}
    finally:
        cluster.shutdown()
    trials = [json.loads(p.read_text()) for p in sorted(out.glob("*-*.json"))]
    print(json.dumps({**nodes, "trials": trials, "counts": counts}))


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
