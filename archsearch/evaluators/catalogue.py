"""The catalogue of accelerators: what is published about each part, with its source. Pure data.

`evaluators.hardware` models a training step on these parts; `archsearch devices` lists them.
A modelling assumption (achievable fractions of peak, penalties) belongs to the model
(`hardware.DeviceModel`), never to a part's published numbers; where such assumptions were fitted
to measurements on a device, the fit lives here apart (`FITTED`), with the recorded run it came
from, so that the numbers a model uses always name their source.
"""

from __future__ import annotations

from dataclasses import dataclass

from archsearch.errors import ConfigError, UnknownNameError
from archsearch.registry import Registry
from archsearch.space.costs import DTYPE_BYTES


# --- dtypes a kernel computes in ---
@dataclass(frozen=True)
class ComputeDtype:
    """A math mode: how operands are stored (a `DTYPE_BYTES` name) and which units run it."""

    storage: str  # tf32 is a tensor-core mode over fp32 storage
    tensor_core: bool

    @property
    def bytes(self) -> int:
        return DTYPE_BYTES[self.storage]


COMPUTE_DTYPES: Registry[ComputeDtype] = Registry("compute dtype")
# Plain FP32 on CUDA cores: PyTorch's default for fp32 matmuls (allow_tf32 is off since 1.12).
COMPUTE_DTYPES.register("fp32", ComputeDtype("fp32", tensor_core=False))
COMPUTE_DTYPES.register("tf32", ComputeDtype("fp32", tensor_core=True))
COMPUTE_DTYPES.register("bf16", ComputeDtype("bf16", tensor_core=True))
COMPUTE_DTYPES.register("fp16", ComputeDtype("fp16", tensor_core=True))
COMPUTE_DTYPES.register("fp8", ComputeDtype("fp8", tensor_core=True))


# --- the catalogue ---
@dataclass(frozen=True)
class Accelerator:
    """What is published about a device. Every number comes from `source`.

    Raises:
        ConfigError: a count, rate or tile is not positive, or a peak names an unknown dtype.
    """

    name: str  # human name
    units: int  # streaming multiprocessors (GPU) or cores (CPU): each runs one tile at a time
    # Dense (no 2:4 sparsity) peak TFLOP/s per compute dtype, FP32 accumulation for 16-bit and
    # FP8 tensor math (what training uses). A dtype missing here is not supported by the part.
    peak_tflops: tuple[tuple[str, float], ...]
    memory_bandwidth: float  # bytes/s of device memory (HBM or GDDR)
    tiles: tuple[tuple[int, int], ...]  # (tile_m, tile_n) output tiles the GEMM library uses
    alignment_bytes: int  # leading dimensions must be multiples of this for full-speed kernels
    launch_overhead_s: float  # fixed cost of one kernel call
    source: str
    # Device memory as the datasheet (the same source, and the part's name) states it, in decimal
    # units (80 GB = 80e9 bytes); 0: unknown. Serving's memory limit on the part.
    memory_bytes: int = 0

    def __post_init__(self) -> None:
        if self.units <= 0:
            raise ConfigError(f"{self.name}: units must be positive, got {self.units}")
        if not self.peak_tflops:
            raise ConfigError(f"{self.name}: peak_tflops needs at least one dtype")
        for dtype, tflops in self.peak_tflops:
            COMPUTE_DTYPES[dtype]  # raises UnknownNameError listing the compute dtypes
            if not tflops > 0:
                raise ConfigError(f"{self.name}: peak {dtype} TFLOP/s must be positive, got {tflops}")
        if not self.memory_bandwidth > 0:
            raise ConfigError(f"{self.name}: memory_bandwidth must be positive")
        if not self.tiles or any(tm <= 0 or tn <= 0 for tm, tn in self.tiles):
            raise ConfigError(f"{self.name}: tiles must be non-empty positive (tile_m, tile_n)")
        if self.memory_bytes < 0:
            raise ConfigError(f"{self.name}: memory_bytes must be >= 0, got {self.memory_bytes}")
        if self.alignment_bytes <= 0 or self.launch_overhead_s < 0:
            raise ConfigError(f"{self.name}: alignment_bytes > 0 and launch_overhead_s >= 0 required")

    @property
    def dtypes(self) -> tuple[str, ...]:
        return tuple(dtype for dtype, _ in self.peak_tflops)

    def peak_flops(self, dtype: str) -> float:
        """Dense peak FLOP/s in `dtype`.

        Raises:
            UnknownNameError: `dtype` is not a compute dtype, or this part lacks it.
        """
        COMPUTE_DTYPES[dtype]  # an unknown dtype is reported as such, not as missing here
        for name, tflops in self.peak_tflops:
            if name == dtype:
                return tflops * 1e12
        valid = ", ".join(self.dtypes)
        raise UnknownNameError(f"{self.name} has no {dtype} peak; valid: {valid}")

    def alignment_elements(self, dtype: str) -> int:
        """Alignment in elements of `dtype`: 16 bytes is 8 bf16, 16 fp8, 4 fp32 elements."""
        return max(1, self.alignment_bytes // COMPUTE_DTYPES[dtype].bytes)


# cuBLAS's typical output tiles (Matrix Multiplication Background guide, section 2.3), largest
# first: larger tiles reuse each loaded operand more, so they win ties. Plus skinny 16-wide tiles
# (16 rows is the smallest tensor-core MMA, and cublasLt lists tiles down to 8x8) so that a GEMM
# with few rows, such as a small batch, is not charged for 64 rows of work.
_CUBLAS_TILES = (
    (256, 128), (128, 256), (128, 128), (256, 64), (64, 256), (128, 64), (64, 128), (64, 64),
    (128, 16), (16, 128),
)  # fmt: skip
# Tensor cores need leading dimensions in multiples of 16 bytes (guide, section 2.2).
_TENSOR_CORE_ALIGNMENT_BYTES = 16
# A typical CUDA kernel launch-to-launch cost; an assumption, not a datasheet figure: calibrate().
_CUDA_LAUNCH_S = 4e-6
_GPU_MODEL_NOTE = (
    "; tiles and 16-byte alignment: NVIDIA Matrix Multiplication Background User's Guide; "
    "launch overhead: assumed 4 us"
)

ACCELERATORS: Registry[Accelerator] = Registry("accelerator")
ACCELERATORS.register(
    "a100-80gb",
    Accelerator(
        name="NVIDIA A100 80GB SXM",
        units=108,
        peak_tflops=(("fp32", 19.5), ("tf32", 156.0), ("bf16", 312.0), ("fp16", 312.0)),
        memory_bandwidth=2.039e12,
        tiles=_CUBLAS_TILES,
        alignment_bytes=_TENSOR_CORE_ALIGNMENT_BYTES,
        launch_overhead_s=_CUDA_LAUNCH_S,
        memory_bytes=80 * 10**9,
        source=(
            "NVIDIA A100 Tensor Core GPU datasheet (80GB SXM): FP32 19.5, TF32 156, BF16/FP16 312 "
            "dense TFLOP/s (sparse figures halved), 2,039 GB/s; NVIDIA A100 Tensor Core GPU "
            "Architecture whitepaper: 108 SMs; no FP8 tensor cores" + _GPU_MODEL_NOTE
        ),
    ),
)
ACCELERATORS.register(
    "h100-sxm",
    Accelerator(
        name="NVIDIA H100 SXM5 80GB",
        units=132,
        peak_tflops=(
            ("fp32", 66.9),
            ("tf32", 494.7),
            ("bf16", 989.4),
            ("fp16", 989.4),
            ("fp8", 1978.9),
        ),
        memory_bandwidth=3.35e12,
        tiles=_CUBLAS_TILES,
        alignment_bytes=_TENSOR_CORE_ALIGNMENT_BYTES,
        launch_overhead_s=_CUDA_LAUNCH_S,
        memory_bytes=80 * 10**9,
        source=(
            "NVIDIA H100 Tensor Core GPU Architecture whitepaper (H100 SXM5): 132 SMs, dense "
            "FP32 66.9, TF32 494.7, BF16/FP16 989.4, FP8 1978.9 TFLOP/s; NVIDIA H100 datasheet "
            "(SXM): 3.35 TB/s HBM3" + _GPU_MODEL_NOTE
        ),
    ),
)
ACCELERATORS.register(
    "h200",
    Accelerator(
        name="NVIDIA H200 SXM 141GB",
        units=132,
        peak_tflops=(
            ("fp32", 67.0),
            ("tf32", 494.5),
            ("bf16", 989.5),
            ("fp16", 989.5),
            ("fp8", 1979.0),
        ),
        memory_bandwidth=4.8e12,
        tiles=_CUBLAS_TILES,
        alignment_bytes=_TENSOR_CORE_ALIGNMENT_BYTES,
        launch_overhead_s=_CUDA_LAUNCH_S,
        memory_bytes=141 * 10**9,
        source=(
            "NVIDIA H200 Tensor Core GPU product brief (SXM): FP32 67, TF32 989, BF16/FP16 1,979, "
            "FP8 3,958 TFLOP/s with sparsity (halved here for dense), 4.8 TB/s HBM3e; same GH100 "
            "SXM5 compute as H100, 132 SMs (H100 whitepaper)" + _GPU_MODEL_NOTE
        ),
    ),
)
ACCELERATORS.register(
    "l4",
    Accelerator(
        name="NVIDIA L4 24GB",
        units=58,
        peak_tflops=(("fp32", 30.3), ("tf32", 60.0), ("bf16", 121.0), ("fp16", 121.0), ("fp8", 242.5)),
        memory_bandwidth=300e9,
        tiles=_CUBLAS_TILES,
        alignment_bytes=_TENSOR_CORE_ALIGNMENT_BYTES,
        launch_overhead_s=_CUDA_LAUNCH_S,
        memory_bytes=24 * 10**9,
        source=(
            "NVIDIA L4 Tensor Core GPU datasheet: FP32 30.3, TF32 120, BF16/FP16 242, FP8 485 "
            "TFLOP/s with sparsity (halved here for dense), 300 GB/s GDDR6; 58 SMs, not in the "
            "datasheet: 7,424 CUDA cores (TechPowerUp GPU database) at 128 per Ada SM (Ada "
            "whitepaper), which matches the datasheet: 58 SMs x 1,024 dense FP16 FLOP/clk x "
            "2.04 GHz boost = 121 TFLOP/s" + _GPU_MODEL_NOTE
        ),
    ),
)
ACCELERATORS.register(
    "rtx4090",
    Accelerator(
        name="NVIDIA GeForce RTX 4090",
        units=128,
        # GeForce Ada runs 16-bit tensor math with FP32 accumulate at half the FP16-accumulate
        # rate (330.3 TFLOP/s); training accumulates in FP32.
        peak_tflops=(("fp32", 82.6), ("tf32", 82.6), ("bf16", 165.2), ("fp16", 165.2), ("fp8", 330.3)),
        memory_bandwidth=1008e9,
        tiles=_CUBLAS_TILES,
        alignment_bytes=_TENSOR_CORE_ALIGNMENT_BYTES,
        launch_overhead_s=_CUDA_LAUNCH_S,
        memory_bytes=24 * 10**9,
        source=(
            "NVIDIA Ada GPU Architecture whitepaper, RTX 4090 column: 128 SMs, FP32 82.6, TF32 "
            "82.6, FP16/BF16 with FP32 accumulate 165.2, FP8 with FP32 accumulate 330.3 dense "
            "TFLOP/s, 1,008 GB/s GDDR6X" + _GPU_MODEL_NOTE
        ),
    ),
)


# --- constants fitted to measured training steps ---
@dataclass(frozen=True)
class FittedModel:
    """Modelling assumptions (`hardware.DeviceModel` fields) fitted to a recorded run, with the
    run they came from: `archsearch fit-device DATA` refits them and prints this entry."""

    fields: tuple[tuple[str, float | None], ...]  # DeviceModel field, fitted value
    data: str  # the recorded run, relative to the repository root
    sha256: str  # of that file
    shapes: int  # shapes with a real step the fit used
    # Each shape's step predicted by a fit on the others: median and worst |error| (fit-device --loo).
    holdout_median: float
    holdout_worst: float


# benchmarks/gpu_model_accuracy_h100_2026-11-22.json: 8 shapes (GPT-2 small/medium, two ~1B
# LLaMA-like, three d_ff alignments, a byte-level proxy), real steps and every GEMM/SDPA call,
# measured on one H100 80GB HBM3 (SXM), torch 2.11.0+cu130, bf16 autocast, fused AdamW.
FITTED: dict[str, FittedModel] = {}
FITTED["h100-sxm"] = FittedModel(
    fields=(
        ("compute_efficiency", 0.7749),
        ("bandwidth_efficiency", 0.8768),
        ("launch_overhead_s", 9.71e-06),
        ("misaligned_factor", 0.1913),
        ("coarse_aligned_factor", 0.9929),
        ("attention_efficiency", 1.402),
        ("attention_backward_efficiency", 0.8621),
        ("attention_seq_half", 2352.0),
        ("misaligned_memory_factor", 0.3243),
        ("eager_kernel_s", 8.317e-06),
        ("host_kernel_s", 2.107e-05),
    ),
    data="benchmarks/gpu_model_accuracy_h100_2026-11-22.json",
    sha256="093e4ca3875ccf680863fdba5117da38b12ff02c9aac1628d2d1ff836c2d1acd",
    shapes=8,
    holdout_median=0.016,
    holdout_worst=0.073,  # d1024-ff2750; byte-d512, the one shape the host holds up, +0.9% left out
)
# benchmarks/data/gpu_campaign_nvidia-h200_steps.json (benchmarks/gpu_campaign.py part 1,
# 2026-11-26, each real step the median of 3 timings in passes over the table, the last two taken
# 2026-11-27): 53 shapes (the 8 above and 45 more: d_model and d_ff alignment, head_dim 32-256, GQA
# groups, seq_len 256-8192, vocab 50257 against 50304, batch 1-32, byte-level shapes of
# examples/gpu.toml; 12 of them, "fresh-", measured 2026-11-27; the 5 with qk-norm or sandwich
# norms measured again that day once the proxy's RMSNorm was fused), on one H200 (143771 MiB),
# torch 2.11.0+cu130, the same step. The file as of commit 85b460f (sha256 below): the 12
# "fresh2-" shapes recorded since are held out of this fit, to judge the next change to the model.
# Both fits price the eager step's memory-bound kernels by the bytes PyTorch's dispatcher counts
# (`counting.eager_memory_ops`) and charge the host per launch and autograd node (`counting.eager_host_ops`,
# 2026-11-28: per launch alone, the held-out worst was 57.7% on the H100 and 35.0% on the H200).
FITTED["h200"] = FittedModel(
    fields=(
        ("compute_efficiency", 0.7745),
        ("bandwidth_efficiency", 0.8465),
        ("launch_overhead_s", 1.02e-05),
        ("misaligned_factor", 0.1649),
        ("coarse_aligned_factor", 0.9424),
        ("attention_efficiency", 1.036),
        ("attention_backward_efficiency", 0.7077),
        ("attention_seq_half", 2128.0),
        ("misaligned_memory_factor", 0.3962),
        ("eager_kernel_s", 8.745e-06),
        ("host_kernel_s", 2.03e-05),
    ),
    data="benchmarks/data/gpu_campaign_nvidia-h200_steps.json",
    sha256="6bfa2709a1ef5f54da1a449b64c9bf0c9ad84f3061a15dd76b839bc68f830552",
    shapes=53,
    holdout_median=0.038,
    holdout_worst=0.264,  # fresh-d512-L8-b2, +26.4%
)
