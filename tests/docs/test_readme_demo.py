"""The figures README.md quotes from `mimo-jobs demo` are what the demo produces: the runs it submits (names
and run ids), each run's last iteration and loss in the status table and the report, and the prose's "loss
... after N iterations, from F". They are read from the pytest run's one demo (helpers.demo_runs) and its
store. Job ids, elapsed times and speeds differ from one machine and one run to the next: those are not
checked; the README says they are one machine's figures."""

from __future__ import annotations

import re

import pytest
from test_readme_outputs import README, console_blocks

from helpers.demo_runs import demo_output, demo_store
from helpers.submit import query

pytestmark = pytest.mark.slow
SUBMITTED = re.compile(r"^submitted (\S+) \((\w{12})\) as local job \S+, attempt 0$", re.MULTILINE)
# a run's row: its name, then `iteration/of` and, some cells later, the loss to 4 decimals
ROW = re.compile(
    r"^│ (?:cpu_local +│ )?(1n-\S+) .*?│ +(\d+)/(\d+) +│(?:[^│\n]*│)*? +(\d+\.\d{4}) +│", re.MULTILINE
)


def _block(starting: str) -> str:
    (block,) = [b for b in console_blocks(README.read_text()) if b and b[0].startswith(starting)]
    return "\n".join(block)


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    db, _ = demo_store(tmp_path_factory)
    out = demo_output(tmp_path_factory)
    last = query(
        db,
        "SELECT r.name, max(i.iteration), arg_max(i.loss, i.iteration), arg_min(i.loss, i.iteration) "
        "FROM iterations i JOIN runs r USING (run_id) WHERE r.study = 'cpu_local' GROUP BY 1",
    )
    return out, {name: (it, last_loss, first_loss) for name, it, last_loss, first_loss in last}


def test_the_submitted_runs_are_the_demos(demo):
    out, _ = demo
    shown = SUBMITTED.findall(_block("$ mimo-jobs demo"))
    assert len(shown) == 4 and sorted(shown) == sorted(SUBMITTED.findall(out)), out[:3000]
    first = _block("$ mimo-jobs demo").splitlines()[1]
    assert first.split(" on this machine")[0] == out.splitlines()[0].split(" on this machine")[0].replace(
        str(README.parent), "<checkout>"
    )


@pytest.mark.parametrize("starting", ["$ mimo-jobs status cpu_local", "$ COLUMNS=200 mimo-jobs report"])
def test_each_runs_last_iteration_and_loss_are_the_demos(demo, starting):
    _, last = demo
    rows = {name: (int(it), int(of), loss) for name, it, of, loss in ROW.findall(_block(starting))}
    assert rows, f"no run rows in README.md's `{starting}` block"
    for name, (it, of, loss) in rows.items():
        got_it, got_loss, _ = last[name]
        assert (it, of, loss) == (got_it, got_it, f"{got_loss:.4f}"), (name, rows[name], last[name])


def test_the_prose_quotes_the_demos_loss(demo):
    _, last = demo
    m = re.search(
        r"same loss \((\d+\.\d+)\s+after\s+(\d+)\s+iterations,\s+from\s+(\d+\.\d+)\)", README.read_text()
    )
    assert m, "README.md no longer says what loss the demo's layouts reach"
    final, iters, first = m.group(1), int(m.group(2)), m.group(3)
    for name, (it, last_loss, first_loss) in last.items():
        assert (f"{last_loss:.4f}", it) == (final, iters), name
        assert f"{first_loss:.{len(first.split('.')[1])}f}" == first, (name, first_loss)
