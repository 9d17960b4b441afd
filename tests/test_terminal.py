"""What a terminal shows (issue 56.4-5): a run's closing line, a DP-SGD run's budget in it, a sweep job's progress
label, and a parallel sweep's lines, each starting a line of its own on the terminal its jobs share."""

import fcntl
import io
import json
import logging
import os
import pty
import re
import select
import struct
import subprocess
import termios
import time
from pathlib import Path

import pytest
from hydra.types import RunMode
from omegaconf import OmegaConf

from normfl.results import closing_line
from normfl.run.sweep import SWEPT
from normfl.run.terminal import FRESH, fresh, fresh_lines, job_label, progress_bar, progress_label
from tests.helpers import REPO, train_command

RECORDS = Path("outputs/records")
NOT_A_CERTIFICATE = ("ALI-DPFL chooses each round's τ from estimates computed on the clients' data without noise "
                     "(ALI Algorithm 2, lines 17-19), which the accountant of the DP-SGD steps does not charge")


def said(key: str, **privacy) -> str:
    """The closing line of the committed record ``key`` (its privacy block updated with ``privacy``)."""
    summary = json.loads((REPO / RECORDS / key / "summary.json").read_text())
    if privacy:
        summary["privacy"] = {**summary["privacy"], **privacy}
    return closing_line(summary, RECORDS / key)


@pytest.mark.parametrize(("key", "privacy", "line"), [
    ("ali_dpfl-4d1e1793a18b", {},      # R_s = 317 rounds stopped it: 414 of its 598 steps
     "normfl: completed in 33m 47s | test accuracy 30.38% final, 30.64% best (round 315) | budget: 414 of R_c = 598 "
     "steps spent, ε 2.178 of 2.5 by the paper's accountant; ε 1.535 certified (pld) | "
     "outputs/records/ali_dpfl-4d1e1793a18b"),
    ("ali_dpfl-4d1e1793a18b", {"not_certified": [NOT_A_CERTIFICATE]},     # as a run made today says it
     "normfl: completed in 33m 47s | test accuracy 30.38% final, 30.64% best (round 315) | budget: 414 of R_c = 598 "
     f"steps spent, ε 2.178 of 2.5 by the paper's accountant; ε 1.535 claimed (pld); not a certificate: "
     f"{NOT_A_CERTIFICATE} | outputs/records/ali_dpfl-4d1e1793a18b"),
    ("dpfl-0070b241eae6", {},           # fixed τ = 2: R_s = 158 rounds of 2 steps
     "normfl: completed in 11m 42s | test accuracy 29.03% final, 29.03% best (round 158) | budget: 316 of R_c = 317 "
     "steps spent, ε 2.003 of 2 by the paper's accountant; ε 1.355 certified (pld) | "
     "outputs/records/dpfl-0070b241eae6"),
    ("dp_normec-03c12a4cd7c8", {},      # no step budget: the ε asked and the ε certified
     "normfl: completed in 4m 29s | test accuracy 10.34% final, 12.48% best (round 40) | ε 8 asked, 12.27 certified "
     "(pld): ABOVE the target | outputs/records/dp_normec-03c12a4cd7c8"),
    ("normec-033bcdb2ac31", {},
     "normfl: completed in 4m 44s | test accuracy 42.14% final, 42.14% best (round 300) | not private | "
     "outputs/records/normec-033bcdb2ac31"),
])
def test_the_closing_line_of_a_record(key, privacy, line, monkeypatch):
    """A DP-SGD run's budget had three answers (steps of R_c, the paper's ε, the certified ε) and its line showed
    the last alone, beside the target the first two answer to."""
    monkeypatch.chdir(REPO)
    assert said(key, **privacy) == line


def test_a_sweep_jobs_label_is_its_number_and_swept_values():
    overrides = ["algo=normec", "dataset=fashion_mnist", "algo.beta=0.1", "algo.gamma=0.01", "rounds=3"]
    assert job_label(1, overrides, ["algo.beta"]) == "#1 algo.beta=0.1"
    assert job_label(12, overrides, ["algo.gamma", "algo.beta"]) == "#12 algo.gamma=0.01 algo.beta=0.1"
    assert job_label(0, overrides, []) == "#0"                               # a sweep of one job
    long = job_label(3, [f"dataset.path=/data/{'x' * 80}.npz"], ["dataset.path"])
    assert len(long) == 60 and long.startswith("#3 dataset.path=/data/xxx") and long.endswith("…")


def test_the_label_comes_from_hydra_and_a_single_run_keeps_its_algorithm(monkeypatch):
    def hydra(mode):
        return OmegaConf.create({"hydra": {"mode": mode, "job": {"num": 1},
                                           "overrides": {"task": ["algo=normec", "algo.beta=0.1", "rounds=3"]}}})

    monkeypatch.setenv(SWEPT, json.dumps(["algo.beta"]))                    # as the sweep's process sets it
    assert progress_label(hydra(RunMode.MULTIRUN)) == "#1 algo.beta=0.1"
    assert progress_label(hydra(RunMode.RUN)) is None and progress_label(None) is None
    cfg = OmegaConf.create({"rounds": 3, "algo": {"name": "normec"}})
    for label, desc, leave in ((None, "normec", True), ("#1 algo.beta=0.1", "#1 algo.beta=0.1", False)):
        bar = progress_bar(cfg, 0, True, label)
        assert (bar.desc, bar.leave) == (desc, leave)
        bar.close()


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_a_line_on_a_terminal_starts_afresh_in_the_same_write_and_a_log_file_keeps_it_plain(tmp_path):
    logger = logging.getLogger("normfl.test_terminal")
    screen, piped = Terminal(), io.StringIO()
    handlers = [logging.StreamHandler(screen), logging.StreamHandler(piped), logging.FileHandler(tmp_path / "log")]
    for h in handlers:
        h.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(h)
    try:
        fresh_lines(logger)
        fresh_lines(logger)                                                  # Hydra's next job: not twice
        logger.warning("normfl: completed")
    finally:
        for h in handlers:
            logger.removeHandler(h)
            h.close()
    assert screen.getvalue() == FRESH + "normfl: completed\n"
    assert piped.getvalue() == (tmp_path / "log").read_text() == "normfl: completed\n"
    assert (fresh(screen), fresh(piped)) == (FRESH, "")


def in_a_terminal(cmd: list[str], timeout: float = 300) -> tuple[int, str]:
    """``cmd``'s exit status and every character it wrote, its stdout and stderr on one pseudo-terminal (120
    columns), as a user's terminal receives them from the sweep and its worker processes."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    proc = subprocess.Popen(cmd, cwd=REPO, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave)
    os.close(slave)
    chunks, deadline, quiet = [], time.monotonic() + timeout, None
    try:
        while time.monotonic() < deadline:
            if select.select([master], [], [], 0.2)[0]:
                try:
                    data = os.read(master, 65536)
                except OSError:                  # every process holding the terminal has closed it
                    break
                if not data:
                    break
                chunks.append(data)
            elif proc.poll() is not None:        # ended, and nothing more for a second: done
                quiet = quiet or time.monotonic()
                if time.monotonic() - quiet > 1:
                    break
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
    return proc.wait(timeout=30), b"".join(chunks).decode(errors="replace")


def screen(text: str) -> list[str]:
    """The lines a terminal shows for ``text``: ``\\r`` back to the line's start, ``\\n`` down, ESC[K erase to the
    line's end, ESC[A up (tqdm's bars beside one another); characters overwrite where the cursor is."""
    lines, row, col = [[]], 0, 0
    for token in re.findall(r"\x1b\[[0-9;?]*[A-Za-z]|[\s\S]", text):
        if token == "\x1b[K":
            del lines[row][col:]
        elif token == "\x1b[A":
            row = max(0, row - 1)
        elif token.startswith("\x1b["):
            continue
        elif token == "\r":
            col = 0
        elif token == "\n":
            row, col = row + 1, 0
            lines.extend([] for _ in range(row + 1 - len(lines)))
        else:
            line = lines[row]
            line.extend(" " * (col + 1 - len(line)))
            line[col], col = token, col + 1
    return ["".join(line).rstrip() for line in lines]


@pytest.mark.slow
@pytest.mark.parametrize("launcher", [["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"], ["hydra/launcher=stacked"]],
                         ids=["joblib", "stacked"])
def test_a_parallel_sweep_labels_its_bars_and_starts_every_closing_line_afresh(launcher, tmp_path, data_root):
    """Two jobs' bars, in two processes (joblib) or side by side in one (stacked), both said ``normec``, and one
    job's closing line could continue the other's bar. In a terminal every closing line now begins a line (on the
    screen, and in the bytes: a return and an erase in the same write as the line), and each bar says its job."""
    code, text = in_a_terminal(train_command(
        f"data_root={data_root}", "algo=normec", "dataset=fashion_mnist", "dataset.train_limit=600",
        "dataset.test_limit=200", "model=logreg", "rounds=3", "clients=3", "algo.beta=0.01,0.1", "progress=true",
        "threads=1", *launcher, f"hydra.sweep.dir={tmp_path}", multirun=True))
    assert code == 0, text[-3000:]
    assert "#0 algo.beta=0.01: " in text and "#1 algo.beta=0.1: " in text
    shown = screen(text)
    closing = [line for line in shown if "normfl: completed" in line]
    assert len(closing) == 2 and all(line.startswith("normfl: completed") for line in closing), shown
    assert text.count(FRESH + "normfl: completed") == 2
    assert not [line for line in shown if "normfl" in line and not line.startswith(("normfl", "["))], shown


@pytest.mark.slow
def test_a_run_starts_with_what_it_runs_and_its_bar_then_estimates_its_time(tmp_path, data_root, capsys, caplog,
                                                                              monkeypatch):
    """Before its first evaluation the run says what it runs (algorithm, data, model, clients, rounds and reading,
    device, backend, precision) and draws its bar from 0; after its first round the bar carries the time a round
    takes and the estimate to the end; on a CPU, a run estimated beyond ``CPU_HINT_S`` says so in one line with what
    runs faster (the threshold lowered to 0 here: any run is long)."""
    from normfl.run import run, training
    from tests.helpers import composed

    cfg_overrides = ["algo=dp_fed_normec", "p=0.5", "dataset=fashion_mnist", "model=logreg", "dataset.train_limit=400",
                     "dataset.test_limit=100", "clients=4", "rounds=4", "eval_every=4", "backend=sequential",
                     "progress=true", f"data_root={data_root}"]
    cfg = composed(*cfg_overrides)
    line = ("normfl: DP-Fed-α-NormEC (dp_fed_normec) on Fashion-MNIST, logreg (7,850 parameters), 4 clients (each "
            "takes part w.p. 0.5), 4 rounds (a step a round), cpu, backend sequential, fp32")
    seen, evaluate = [], training.Training.evaluate

    def first_evaluation(self, row, at, releases):
        if not seen:                                      # what the user has been shown by then
            seen.append((list(caplog.messages), capsys.readouterr().err))
        return evaluate(self, row, at, releases)

    def unhurried_bar(*args, **kwargs):                    # drawn at most once a minute by itself: the first round
        bar = progress_bar(*args, **kwargs)                 # is shown because the run draws it, however fast it was
        bar.mininterval = 60.0
        return bar

    progress_bar = training.progress_bar
    monkeypatch.setattr(training.Training, "evaluate", first_evaluation)
    monkeypatch.setattr(training, "progress_bar", unhurried_bar)
    with caplog.at_level(logging.INFO, logger="normfl"):
        run(cfg, tmp_path / "run")
    (messages, bar), after = seen[0], capsys.readouterr().err
    assert line in messages and "0/4 [00:00<?, ?it/s]" in bar, (messages, bar)
    assert re.search(r"1/4 \[\d\d:\d\d<\d\d:\d\d, +[\d.]+(s/it|it/s)\]", after), after   # a round's time, the rest
    assert not any("to go on this CPU" in m for m in caplog.messages)
    monkeypatch.setattr(training, "CPU_HINT_S", 0.0)

    def slow_evaluation(self, row, at, releases):          # an evaluation of 0.3 s: a round's time includes it
        if row["round"]:
            time.sleep(0.3)
        return evaluate(self, row, at, releases)

    monkeypatch.setattr(training.Training, "evaluate", slow_evaluation)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="normfl"):
        run(composed(*[o for o in cfg_overrides if not o.startswith("eval_every")], "eval_every=1"),
            tmp_path / "hinted")
    hint = [m for m in caplog.messages if "to go on this CPU" in m]
    found = re.match(r"normfl: about ([\d.]+)s to go on this CPU \(([\d.]+)s a round\)\. On a GPU: the same "
                     r"command with `device=cuda backend=stacked`", hint[0] if hint else "")
    assert len(hint) == 1 and found, hint
    assert float(found[2]) >= 0.3 and float(found[1]) >= 3 * 0.3, hint   # 3 rounds to go, each evaluated
