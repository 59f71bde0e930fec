"""A gate kind a test registers from its pytester project: two seeds, nothing frozen, its check written by the test.

The module text and the conftest line that registers it, for ``pytester.makepyfile(**seeded_gate(...))``: a gate
that behaves as a test needs (runs out of GPU memory, has its compiler killed) through the plugin's real path."""

MODULE = '''
{imports}
from h3gate.verdict import Check, GateResult

GATE = "{name}"
{state}

def items(run):
    return [{{"seed": 1}}, {{"seed": 2}}]


def bounds_file(run):
    return None


def check_item(run, _bounds):
{body}
'''

CONFTEST = '''
from h3gate.gates import SEEDS, Gate, register

register(Gate("{name}", (SEEDS,), frozen_nothing="nothing to freeze", module_name="{name}_gate"))
'''


def seeded_gate(name: str, body: str, imports: str = "", state: str = "") -> dict[str, str]:
    """``{name}_gate`` (its ``check_item`` is ``body``, indented) and the conftest that registers it."""
    return {f"{name}_gate": MODULE.format(name=name, imports=imports, state=state, body=body),
            "conftest": CONFTEST.format(name=name)}
