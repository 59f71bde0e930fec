"""The command line the kernel-variant benchmarks (``norm_variants.py``, ``attention_bwd_variants.py``) share."""

import argparse

from h3gate.bench import SHAPES


def parse(doc: str, default_configs: str, parse_config) -> tuple[argparse.Namespace, dict]:
    """The arguments (``--shape``, ``--device``) and the ``--configs`` as {name: parse_config(name)};
    ``parse_config`` raises ValueError, naming the expected form, on a malformed config."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--configs", default=default_configs,
                        help=f"comma-separated tilings of the variant (default: {default_configs})")
    parser.add_argument("--shape", choices=tuple(SHAPES), default="release")
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    try:
        configs = {name: parse_config(name) for name in args.configs.split(",")}
    except ValueError as error:
        parser.error(str(error))
    return args, configs
