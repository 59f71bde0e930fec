"""``h3gate bench`` and ``h3gate power``: the commands that run the candidate on a device and print a table (speed
against the provider; gates against mutants and provider variants), optionally written as JSON."""

from __future__ import annotations

import sys
from pathlib import Path

from h3gate.cli import common


def _bench(args) -> int:
    import shlex

    from h3gate import bench

    device = common.device(args.device)
    shape = args.shape or ("release" if device.startswith("cuda") else "small")
    command = "h3gate " + " ".join(shlex.quote(a) for a in sys.argv[1:])

    def save(report):
        print(bench.table(report), flush=True)
        if args.out:
            common.write_json(args.out, {**report, "command": command})

    ops = args.ops.split(",") if args.ops else None
    candidate = common.candidate(args.candidate)
    with common.refusing(ValueError):  # an unknown op, a step that cannot fit, no round: refused before any timing
        bench.check_ops(ops)
        bench.check_step(shape, device, args.step_layers)
        bench.check_rounds(args.rounds)
    bench.run(
        candidate,
        shape,
        device,
        ops=ops,
        block=not args.no_block,
        step_layers=args.step_layers or None,
        progress=lambda message: print(f"  timing {message}", file=sys.stderr, flush=True),
        on_section=save,
        grad_kind=args.output_grad,
        rounds=args.rounds,
    )
    return 0


def _power(args) -> int:
    from h3gate import numerics
    from h3gate.bounds import BoundsError
    from h3gate.files import FileFormatError
    from h3gate.gates import power
    from h3gate.model.factory import load_model

    device = common.device(args.device)
    if device == "cpu":  # the bits of the gate suite's power test: pytest-h3 runs CPU sessions on one thread too
        numerics.one_cpu_thread()
    base = common.candidate(args.base or ("h3_triton" if device.startswith("cuda") else "provider"))
    with common.refusing(BoundsError, FileFormatError, ValueError):
        report = power.measure(
            load_model(args.model),
            device,
            Path(args.thresholds),
            Path(args.out),
            base,
            mutants=args.mutants.split(",") if args.mutants else tuple(power.MUTANTS),
            variants=args.variants.split(",") if args.variants else None,
            gates=args.gates.split(",") if args.gates else None,
            progress=lambda message: print(f"  {message}", file=sys.stderr, flush=True),
        )
    print(f"mutants of {base.name}; gates meant for each mutant must catch it, variants must pass everywhere")
    print(report.table())
    print(f"non-discriminating model-gate taps (no mutant exceeded them): {', '.join(report.non_discriminating) or 'none'}")
    for row in report.failures:
        print(f"FAILED {row.subject} x {row.gate}: {row.verdict}: {row.line}")
    for item in report.blind_kernel_items:
        print(f"FAILED kernel {item}: rejected none of its op's mutants (its checks cannot see those bugs)")
    if args.json:
        common.write_json(args.json, report.to_json())
    return 0 if report.passed else 1


def add_commands(commands) -> None:
    from h3gate.gates import REGISTRY

    bench = commands.add_parser(
        "bench",
        help="time the candidate against the provider: every op forward and backward, one block, one transformer step",
        description="Times are medians (triton.testing.do_bench on a GPU) over rounds that time candidate and provider "
        "in turn; every ratio is provider time / candidate "
        "time measured in the same process, every rate is also given as a fraction of the GEMM and copy ceilings "
        "measured in the same run. On CPU the kernels run under Triton's interpreter: the numbers only show the "
        "command works.",
    )
    bench.add_argument("--shape", choices=("release", "small"), default=None, help="release (GPU default) or small (CPU default)")
    bench.add_argument("--device", default=None, help="cuda or cpu (default: cuda when visible)")
    bench.add_argument("--candidate", default="h3_triton", help="candidate spec (default: h3_triton)")
    bench.add_argument("--ops", default=None, help="comma-separated ops to time (default: all)")
    bench.add_argument("--no-block", action="store_true", help="skip the one-block benchmark")
    bench.add_argument("--step-layers", type=int, default=0, help="also time one transformer forward with this many blocks (release: 50)")
    bench.add_argument("--output-grad", choices=("random", "ones"), default="random",
                       help="the gradient backward passes start from: seeded normal, or all ones (a degenerate operand "
                       "from which backward passes run faster than from a real gradient)")
    bench.add_argument("--rounds", type=int, default=3,
                       help="time candidate and provider in turn this many times and report each one's median "
                       "(default: 3): a card that moves its clock under its power limit reads the drift between two "
                       "times taken one after the other as a speed difference")
    bench.add_argument("-o", "--out", default=None, help="write the JSON report here (e.g. benchmarks/results/h200.json)")
    bench.set_defaults(run=_bench)

    power = commands.add_parser(
        "power",
        help="run every gate against every mutant and every provider variant: the table of what each gate catches",
        description="Mutants (h3gate.candidates.mutants) must be caught by the gates meant for them, provider variants must be "
        "accepted everywhere; model-gate taps no mutant exceeded are listed as non-discriminating. Needs the "
        "model's frozen model, block and generation-preflight bounds for the device.",
    )
    power.add_argument("--model", default="tiny", help="tiny (default), edge, small or a checkpoint folder")
    power.add_argument("--device", default=None, help="cpu or cuda (default: cuda when visible)")
    power.add_argument(
        "--base",
        default=None,
        help="candidate the mutants are made from (default: h3_triton on a GPU; provider on CPU, where Triton's "
        "interpreter makes each h3_triton gate run take minutes - the bugs are emulated identically around either)",
    )
    power.add_argument("--gates", default=None, help="comma-separated gates (default: every registered gate but power "
                       "and those a test measures: " + ", ".join(
                           name for name, gate in REGISTRY.items() if name != "power" and not gate.measured_by_test) + ")")
    power.add_argument("--mutants", default=None, help="comma-separated mutants (default: all)")
    power.add_argument("--variants", default=None, help="comma-separated provider variants (default: all of the device)")
    power.add_argument("--thresholds", default="thresholds", help="the thresholds folder (default: ./thresholds)")
    power.add_argument("--out", default="h3-out/power", help="working folder for captures and generations")
    power.add_argument("-o", "--json", default=None, help="write the report as JSON here")
    power.set_defaults(run=_power)
