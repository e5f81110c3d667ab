"""Seeds, replay and margins.

Every test runs under one seed: GRASSFLOW_TEST_SEED when set (to replay a printed seed), else a
fresh one. It seeds the global RNGs (torch, numpy, random) and the `gen` fixture's generator, and is
printed with the command that replays it. `pytest --seeds N` runs each randomized test (one that
takes `gen`) under N fresh seeds plus the regression seeds in tests/regression_seeds.txt, and prints
each test's worst margin (error / tolerance, as recorded by margins.within):
`make test-seeds N=200`."""

import os
import random
import secrets
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers import margins
from helpers.specs import make_lm_tokens, make_snli_tokens

REGRESSION_SEEDS = Path(__file__).with_name("regression_seeds.txt")

# Under pytest-xdist (`make test`: -n 2) the workers share the machine's cores. torch's default, a
# thread per core in each worker, oversubscribes them, and OpenMP's spinning threads then run a test
# several times slower (measured: two copies of test_the_distance_effect side by side took 410 s
# each at 2 threads, 56 s at 1). So each worker, and what it starts, gets its share of the cores
# unless OMP_NUM_THREADS says otherwise (a pipeline's jobs set their own: train.threads).
if os.environ.get("PYTEST_XDIST_WORKER"):
    _share = len(os.sched_getaffinity(0)) // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, _share)))
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


def pytest_addoption(parser):
    parser.addoption(
        "--seeds",
        type=int,
        default=0,
        help="run the randomized tests (those taking `gen`) under N fresh seeds and the "
        "regression seeds, and print each test's worst margin",
    )


def _regression_seeds() -> list[int]:
    return [
        int(x.split("#")[0])
        for x in REGRESSION_SEEDS.read_text().splitlines()
        if x.split("#")[0].strip()
    ]


def pytest_generate_tests(metafunc):
    n = metafunc.config.getoption("seeds")
    if n and "gen" in metafunc.fixturenames:
        seeds = _regression_seeds() + [secrets.randbits(31) for _ in range(n)]
        metafunc.parametrize("seed_override", seeds, indirect=True, ids=[f"seed{s}" for s in seeds])


# --- under pytest-xdist (`make test`: -n 2) ------------------------------------------------------
def xdist_groups() -> dict[str, str]:
    """{tests/<file>::<test>: group} of the tests that must share a worker, read from the test files
    (the controller collects nothing): the SLURM tests (one cluster on this machine) and the tests
    that take the demo (built once; the staleness tests edit it in place: never two at once; the
    SLURM tests only read its tables at the end, so they may run beside them)."""
    import ast

    out = {}
    root = Path(__file__).parent
    for f in sorted(root.rglob("test_*.py")):
        for node in ast.parse(f.read_text()).body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                slurm = any("mark.slurm" in ast.unparse(d) for d in node.decorator_list)
                if slurm or "demo" in {a.arg for a in node.args.args}:
                    out[f"tests/{f.relative_to(root).as_posix()}::{node.name}"] = (
                        "slurm" if slurm else "demo"
                    )
    return out


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """The groups each to one worker, the SLURM group's alone where the workers outnumber the cores
    (helpers.workers)."""
    from helpers.workers import scheduler

    return scheduler(config, log, xdist_groups(), cores=len(os.sched_getaffinity(0)))


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(config, items):
    # The finished demo costs 3-4 minutes of 2 cores to build, more than half of the default tier's
    # 5: every test that reads it (the `demo` fixture, directly or through another) is in the slow
    # tier, which CI runs; the default tier keeps the planning's dry runs and every unit test.
    for item in items:
        if "demo" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)
    # the two longest groups first (the SLURM tests, the demo's), so that two workers start them at
    # once, then the files with slow tests: the run ends on short tests, which keep both workers
    # busy to the end (a CI run that ended on the docs' dry runs left a core idle for a minute)
    items.sort(
        key=lambda i: (
            "demo" not in getattr(i, "fixturenames", ()),
            not i.get_closest_marker("slurm"),
            not i.get_closest_marker("slow"),
        )
    )
    if config.getoption("seeds"):
        keep = [i for i in items if "gen" in getattr(i, "fixturenames", ())]
        config.hook.pytest_deselected(items=[i for i in items if i not in keep])
        items[:] = keep


@pytest.fixture
def seed_override(request):
    return getattr(request, "param", None)


@pytest.fixture(autouse=True)
def test_seed(request, seed_override):
    """This test's seed; the global RNGs are seeded with it."""
    env = os.environ.get("GRASSFLOW_TEST_SEED")
    seed = seed_override if seed_override is not None else int(env) if env else secrets.randbits(31)
    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)
    margins.begin(request.node.nodeid, seed)
    print(
        f"[{request.node.name}] seed={seed}  (replay: GRASSFLOW_TEST_SEED={seed} pytest "
        f"'{margins.running()}')"
    )
    return seed


@pytest.fixture
def gen(test_seed):
    """A random generator seeded with this test's seed."""
    return torch.Generator().manual_seed(test_seed)


def pytest_terminal_summary(terminalreporter, config):
    if config.getoption("seeds") and margins.RECORDED:
        terminalreporter.write_line(margins.summary())


def _every_test_but_the_gpus(config) -> bool:
    """This session is CI's: every test but the GPU tier's (`make test TIERS="not gpu"`), none left
    out."""
    return (
        config.option.markexpr == "not gpu"
        and config.args_source == pytest.Config.ArgsSource.TESTPATHS
        and not config.option.keyword
        and not config.getoption("seeds")
    )


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus):
    """In CI's session, the full Snakemake executions counted against those declared, each with what
    it is for (tests/helpers/executions.py): a test that makes an undeclared one fails the run."""
    if os.environ.get("PYTEST_XDIST_WORKER") or not _every_test_but_the_gpus(session.config):
        return
    from helpers import executions

    root = session.config._tmp_path_factory.getbasetemp()
    made, wrong = executions.made(root), executions.audit(root)
    report = session.config.pluginmanager.get_plugin("terminalreporter")
    report.write_line(
        f"full Snakemake executions: {sum(made.values())} in {len(made)} tests (declared: "
        f"{sum(n for n, _ in executions.EXECUTIONS.values())}; tests/helpers/executions.py)"
    )
    for line in wrong:
        report.write_line(f"error: {line}", red=True)
    if wrong and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(scope="session", autouse=True)
def private_gpu_slots(tmp_path_factory):
    """Each pytest process its own GPU-slot directory: two xdist workers never share a stand-in
    pool."""
    os.environ.setdefault("GRASSFLOW_SLOTS_DIR", str(tmp_path_factory.getbasetemp() / "slots"))


@pytest.fixture(scope="session")
def tokens(tmp_path_factory):
    """Token files of a tiny synthetic corpus with a trained tokenizer (language modelling)."""
    return make_lm_tokens(tmp_path_factory.mktemp("tokens"))


@pytest.fixture(scope="session")
def snli_tokens(tmp_path_factory):
    """Token files of tiny synthetic sentence pairs (SNLI)."""
    return make_snli_tokens(tmp_path_factory.mktemp("snli"))


@pytest.fixture(scope="session")
def demo(tmp_path_factory):
    """The demo preset run once through Snakemake in a scratch copy of the repository, for every
    tests/pipeline/ file; every job records the grassflow files it imported (imports/). It runs as a
    user with a multi-GPU workstation would: on a stand-in pool of two GPUs (GRASSFLOW_GPUS=0,1)
    with train.runs_per_gpu: 2 and `grassflow gpus`'s flag, more cores than slots; the jobs still
    compute on the CPU (the slots' test reads their records). The LM's runs write TensorBoard event
    files and an MLflow store (train.trackers, an execution key: the tables are the same). Every
    test that redoes part of it without the pool (the SIGKILL, crafted-checkpoint and SLURM tests)
    compares its tables with it: packing changes where and when, never what. Tests that edit it
    restore what they edit. Under pytest-xdist the workers share one demo, built by the first that
    asks (a lock in the session's shared temporary directory); the tests that edit it are one group,
    run by one worker (pytest_collection_modifyitems)."""
    import fcntl
    import shutil

    from helpers.dag import POOL_ENV, copy_repo, pool_flag, snakemake

    root = tmp_path_factory.getbasetemp()
    root = root.parent if os.environ.get("PYTEST_XDIST_WORKER") else root
    work, done = root / "demo", root / "demo.done"
    with open(root / "demo.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if done.exists():
            return work
        for d in (work, root / "demo.pristine"):  # a build that failed in another worker: anew
            shutil.rmtree(d, ignore_errors=True)
        work.mkdir()
        copy_repo(work)
        (work / "pool.yaml").write_text(
            "presets: {demo: {train: {runs_per_gpu: 2, trackers: [tensorboard, mlflow]}}}\n"
        )
        env = {
            **POOL_ENV,
            "GRASSFLOW_SLOTS_DIR": str(work / ".slots"),
            "GRASSFLOW_RECORD_IMPORTS": str(work / "imports"),
        }
        flag = pool_flag(work, env)
        assert flag == ["--resources", "gpu=4"], flag
        # 5 jobs, 4 slots
        snakemake(work, "--configfile", str(work / "pool.yaml"), *flag, "--cores", "5", env=env)
        # the copies' source (helpers.dag.copy_demo): the demo as built, which tests editing the
        # demo in place (beside the copying SLURM tests) never reach
        shutil.copytree(work, root / "demo.pristine", symlinks=True)
        done.touch()
    return work
