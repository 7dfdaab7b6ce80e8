#!/usr/bin/env bash
# The wheels the GPU campaign's part 2 (archsearch search on Ray) needs on a lent machine whose
# image has PyTorch, pandas, scipy, typer and rich but not Ray, Optuna or SQLAlchemy, and which
# reaches no package registry. Run here, where pip reaches one, from the repository root:
#
#   bash benchmarks/gpu_campaign_wheels.sh            # into .whl/ (git-ignored via .git/info/exclude)
#
# then carry `.whl` in each device call and start its command with
#
#   python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
#     && export PYTHONPATH=/tmp/site:$PWD || exit
#
# Ray's Java jars (unused by a Python search) are dropped from its wheel so the wheels and the
# working tree fit the 64 MiB a call carries. Versions are this checkout's own (pip show), so the
# GPU runs the code the suite tested.
set -euo pipefail
cd "$(dirname "$0")/.."
dest=${1:-.whl}
python_version=${PYTHON_VERSION:-3.12}  # the lent image's python3
if [[ "$dest" != /* ]]; then  # inside the checkout: never committed
  exclude=$(git rev-parse --git-path info/exclude)
  mkdir -p "$(dirname "$exclude")"
  grep -qxF "/$dest/" "$exclude" 2>/dev/null || echo "/$dest/" >>"$exclude"
fi
mkdir -p "$dest"

packages=(ray optuna sqlalchemy alembic colorlog mako jsonschema jsonschema-specifications referencing rpds-py)
pinned=()
for name in "${packages[@]}"; do
  version=$(python3 -m pip show "$name" 2>/dev/null | awk '/^Version:/ {print $2}')
  if [ -z "$version" ]; then
    echo "error: $name is not installed here; install the project first (pip install -e .)" >&2
    exit 1
  fi
  pinned+=("$name==$version")
done

platforms=()
for p in manylinux_2_39_x86_64 manylinux_2_35_x86_64 manylinux_2_34_x86_64 manylinux_2_31_x86_64 \
  manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 \
  manylinux2014_x86_64 manylinux1_x86_64; do
  platforms+=(--platform "$p")
done
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version "$python_version" \
  --implementation cp "${platforms[@]}" -d "$dest" "${pinned[@]}"

# Ray without its jars: a smaller wheel of the same files otherwise.
for wheel in "$dest"/ray-*.whl; do
  python3 - "$wheel" <<'EOF'
import os, sys, zipfile

path = sys.argv[1]
tmp = path + ".tmp"
with zipfile.ZipFile(path) as src, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as dst:
    dropped = 0
    for item in src.infolist():
        if item.filename.startswith("ray/jars/"):
            dropped += 1
            continue
        dst.writestr(item, src.read(item.filename))
os.replace(tmp, path)
print(f"{os.path.basename(path)}: {dropped} jar files dropped")
EOF
done
du -ch "$dest"/*.whl | tail -1
