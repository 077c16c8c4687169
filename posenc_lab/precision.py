"""Does this machine compute bf16 in hardware? A bf16 run where it does not is warned about (or refused).

A CPU multiplies bf16 matrices fast only with AMX (``amx_bf16``) or AVX512-BF16 (``avx512_bf16``);
without them oneDNN converts through fp32 and bf16-mixed training runs 5-20x *slower* than fp32
(docs/PERFORMANCE.md: 9 vs 166 tokens/s for xl ``base`` on an AVX2 EPYC). A GPU needs compute
capability 8.0 (Ampere) or later. ``bf16_check`` (conf/train.yaml): warn | error | off.
"""

from __future__ import annotations

import logging
import warnings

import torch

from .errors import ConfigError

log = logging.getLogger("posenc_lab.precision")
CPU_BF16_FLAGS = ("amx_bf16", "avx512_bf16")
POLICIES = ("warn", "error", "off")


def cpu_flags(cpuinfo: str = "/proc/cpuinfo") -> set[str] | None:
    """The CPU's feature flags (``lscpu``'s Flags), or None where /proc/cpuinfo cannot tell."""
    try:
        with open(cpuinfo) as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return None


def bf16_hardware(device_type: str, flags: set[str] | None = None) -> str | None:
    """None if ``device_type`` ("cpu" | "cuda") computes bf16 in hardware, else the reason it does not.
    ``flags``: the CPU flags (default: this machine's)."""
    if device_type == "cuda":
        if torch.cuda.is_available() and not torch.cuda.is_bf16_supported(including_emulation=False):
            major, minor = torch.cuda.get_device_capability()
            return f"this GPU (compute capability {major}.{minor}) has no bf16 units (needs 8.0, Ampere, or later)"
        return None
    if device_type != "cpu":
        return None  # other accelerators: their own business
    flags = cpu_flags() if flags is None else flags
    if flags is None:
        return None  # cannot tell: no warning rather than a wrong one
    if flags & set(CPU_BF16_FLAGS):
        return None
    return (
        f"this CPU has no bf16 instructions (its flags lack {' and '.join(CPU_BF16_FLAGS)}; torch reports "
        f"{torch.backends.cpu.get_cpu_capability()}), so bf16 matmuls are emulated through fp32"
    )


def check_precision(precision: object, device_type: str, policy: str = "warn", flags: set[str] | None = None) -> None:
    """Warn (policy "warn"), raise ConfigError ("error") or stay silent ("off") when ``precision`` asks for
    bf16 on a device without bf16 hardware. Called once, where the trainer is built."""
    if policy not in POLICIES:
        raise ConfigError(f"bf16_check must be one of {', '.join(POLICIES)}, got {policy!r}")
    if "bf16" not in str(precision) or policy == "off":
        return
    reason = bf16_hardware(device_type, flags)
    if reason is None:
        return
    message = (
        f"trainer.precision={precision} on {device_type}: {reason}; bf16 will run several times slower "
        f"than 32-true here. Use trainer.precision=32-true on this machine, or bf16_check=off to run it anyway"
    )
    if policy == "error":
        raise ConfigError(message)
    warnings.warn(message, stacklevel=2)
    log.warning(message)
