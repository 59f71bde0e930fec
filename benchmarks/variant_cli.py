"""What the kernel-variant benchmarks (``gemm_variants.py``, ``attention_variants.py``) share: their command line
and the scratch memory Triton needs for tensor descriptors built on the device."""

import argparse

import torch
import triton

from h3gate.bench import SHAPES


def _allocate(size: int, alignment: int, stream):
    return torch.empty(size, dtype=torch.int8, device="cuda" if torch.cuda.is_available() else "cpu")


def parse(doc: str, default_configs: str, example: str, parse_config) -> tuple[argparse.Namespace, dict]:
    """The arguments (``--shape``, ``--device``) and the ``--configs`` as {name: parse_config(name)}; Triton's
    descriptor allocator installed. ``parse_config`` raises ValueError on a malformed config."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--configs", default=default_configs,
                        help=f"comma-separated tilings of the variant, e.g. {example} (default: {default_configs})")
    parser.add_argument("--shape", choices=tuple(SHAPES), default="release")
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    try:
        configs = {name: parse_config(name) for name in args.configs.split(",")}
    except ValueError as error:
        parser.error(str(error))
    triton.set_allocator(_allocate)
    return args, configs
