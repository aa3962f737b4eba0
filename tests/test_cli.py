"""CPU tier: `python -m symnccl`, as a new user meets it (its options,
help, errors and the benchmark's --report), and the error a machine with
no NVIDIA driver gives."""
import json
import os
import re
import subprocess
import sys

import pytest

import symnccl
from symnccl import __main__ as cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "benchmarks", "results")


def _run(*args):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [os.path.dirname(os.path.dirname(symnccl.__file__))] +
        [p for p in [env.get("PYTHONPATH")] if p])
    return subprocess.run([sys.executable, "-m", "symnccl", *args],
                          capture_output=True, text=True, env=env,
                          timeout=120)


def test_options_before_bench_are_an_error_not_the_check(capsys):
    """`--quick bench` neither runs the check silently nor guesses: it
    says that bench comes first (exit 2), before any report is printed."""
    with pytest.raises(SystemExit) as e:
        cli.main(["--quick", "bench"])
    assert e.value.code == 2
    out, err = capsys.readouterr()
    assert "`bench` must come first" in err
    assert "symnccl " + symnccl.__version__ not in out


def test_bench_report_of_a_missing_file_is_one_clear_line():
    r = _run("bench", "--report", "/nonexistent.json")
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    assert r.stderr.strip() == ("python -m symnccl bench --report: cannot "
                                "read /nonexistent.json: No such file or "
                                "directory")


def test_bench_report_of_a_file_that_is_not_results_json(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text("{not json")
    r = _run("bench", "--report", str(bad))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert f"{bad} is not a results JSON" in r.stderr


def test_help_is_whole_and_named_python_m_symnccl():
    r = _run("--help")
    assert r.returncode == 0
    assert r.stdout.startswith("usage: python -m symnccl ")
    # the description is the whole module docstring, not its first line
    assert "a usage error." in r.stdout
    assert "python -m symnccl bench --help" in r.stdout
    b = _run("bench", "--help")
    assert b.returncode == 0
    assert b.stdout.startswith("usage: python -m symnccl bench ")


def test_check_options_state_their_units(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--timeout SECONDS wall-clock limit of the whole check in " \
           "seconds (default: 900)" in out
    assert "--nranks N number of GPUs to check" in out
    from symnccl._selftest import QUICK_SIZES
    assert ("all-reduce sizes of " + ", ".join(map(str, QUICK_SIZES)) +
            " elements") in out


@pytest.mark.parametrize("argv", [["--nranks", "0"], ["--nranks", "-1"],
                                  ["--nranks", "two"],
                                  ["bench", "--nranks", "0"]])
def test_bad_nranks_is_a_usage_error(argv, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "argument --nranks:" in err
    assert "leave --nranks out" in err or "whole number" in err


def test_bad_timeout_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["--timeout", "0"])
    assert e.value.code == 2
    assert "must be > 0 seconds, got 0" in capsys.readouterr().err


def test_version_prints_the_package_version(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == \
        f"symnccl {symnccl.__version__}"


def _results_json(tmp_path):
    """A copy of a recorded all-reduce run in a read-only directory."""
    src = os.path.join(RESULTS, "h200x2_bfloat16.json")
    if not os.path.exists(src):
        src = os.path.join(RESULTS, "allreduce_h200x2_bfloat16.json")
    ro = tmp_path / "ro"
    ro.mkdir()
    dst = ro / "run.json"
    dst.write_text(open(src).read())
    ro.chmod(0o555)
    return dst


@pytest.mark.parametrize("out", [None, "chosen.png"])
def test_bench_report_plots_into_out_or_cwd_never_beside_the_json(
        tmp_path, monkeypatch, capsys, out):
    doc = _results_json(tmp_path)
    bench = cli._bench_module()
    written = []
    monkeypatch.setattr(bench, "plot",
                        lambda d, path: written.append((d, path)))
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    argv = ["bench", "--report", str(doc)] + (["--out", out] if out else [])
    assert cli.main(argv) == 0
    assert len(written) == 1
    d, path = written[0]
    assert d == json.load(open(doc))
    assert path == (out or "run.png")
    assert f"plot: {cwd / path}" in capsys.readouterr().out
    assert sorted(os.listdir(doc.parent)) == ["run.json"]


def test_no_driver_says_no_nvidia_driver_was_found():
    """On a machine without any NVIDIA driver, creating a communicator says
    so, not that the driver is too old for the runtime."""
    if symnccl.versions()["cuda_driver"] != "none":
        pytest.skip("an NVIDIA driver is loaded here")
    with pytest.raises(symnccl.CudaError) as e:
        symnccl.Communicator(symnccl.get_unique_id(), 0, 1)
    assert "no NVIDIA driver was found" in str(e.value)
    assert "insufficient" not in str(e.value)
    assert e.value.code == 35   # cudaErrorInsufficientDriver, unchanged


def test_bench_options_state_their_units():
    r = _run("bench", "--help")
    assert r.returncode == 0
    out = " ".join(r.stdout.split())
    assert "--iters CALLS calls per timed CUDA graph" in out
    assert "--reps N timed repeats of each loop; the median" in out
    assert "--max-bytes BYTES largest message size in bytes" in out
    assert "--nranks N number of GPUs, one process each" in out
    assert "same run, same process layout (one process per GPU)." in out


def _no_gpu():
    from symnccl.bootstrap import local_device_count
    if local_device_count() > 0:
        pytest.skip("a GPU is visible")


@pytest.mark.parametrize("argv,says", [
    (["--nranks", "2"], "needs at least 2 GPUs (--nranks 2)"),
    ([], "needs at least 2 GPUs, one process each")])
def test_bench_without_gpus_is_one_line_saying_what_was_found(argv, says):
    """Without a GPU, `bench --nranks 2` ended in torch's 20-line "Found no
    NVIDIA driver" traceback, and plain `bench` did not say how many GPUs
    it found."""
    _no_gpu()
    r = _run("bench", *argv)
    assert r.returncode == 1, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert says in lines[0] and "no CUDA GPU is visible" in lines[0], lines


def test_bench_help_lists_every_method_the_benchmark_runs():
    """--help's method list comes from the benchmark's own tuples (it
    lacked symnccl:ll128) and names no file that does not exist."""
    r = _run("bench", "--help")
    assert r.returncode == 0, r.stderr
    bench = cli._bench_module()
    names = (bench.SYMNCCL_METHODS + bench.TENSOR_METHODS + bench.ANCHORS +
             bench.CEILING)
    assert "symnccl:ll128" in names
    for m in names:
        assert m in r.stdout, m
    for path in re.findall(r"[\w.-]+/[\w./-]+\.json", r.stdout):
        assert os.path.exists(os.path.join(ROOT, path)), path
    assert "benchmarks/" not in r.stdout   # not there after a wheel install


def test_bench_help_works_from_the_copy_a_wheel_ships(tmp_path):
    """A wheel holds symnccl/_bench_allreduce.py (setup.py BuildPy) and no
    benchmarks/ folder: the help comes from that copy alone."""
    import shutil
    pkg = tmp_path / "symnccl"
    shutil.copytree(os.path.dirname(symnccl.__file__), pkg,
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(os.path.join(ROOT, "benchmarks", "bench_allreduce.py"),
                pkg / "_bench_allreduce.py")
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    r = subprocess.run([sys.executable, "-m", "symnccl", "bench", "--help"],
                       capture_output=True, text=True, env=env, timeout=120,
                       cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "symnccl:ll128" in r.stdout


def test_algo_supported_without_a_communicator_is_a_type_error():
    """algo_supported("all_reduce", "ll", "bfloat16") (the collective where
    the communicator goes) raised AttributeError."""
    with pytest.raises(TypeError, match=r"comm must be a symnccl\."
                                        r"Communicator, got str"):
        symnccl.algo_supported("all_reduce", "ll", "bfloat16")


@pytest.mark.parametrize("script", ["bench_allreduce.py",
                                    "bench_collectives.py",
                                    "bench_backend.py", "bench_step.py"])
def test_benchmarks_that_spawn_their_ranks_refuse_torchrun(script):
    """These benchmarks start one process per GPU themselves: under
    torchrun every process started a team of its own on the same GPUs,
    and a run printed nothing for 100 s (session 19). Now one line says
    how to run them, before torch is imported or a GPU is touched."""
    env = dict(os.environ, WORLD_SIZE="2", RANK="0")
    r = subprocess.run([sys.executable,
                        os.path.join(ROOT, "benchmarks", script),
                        "--nranks", "2"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 1, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert f"{script} starts its own process per GPU" in lines[0]
    assert "not under torchrun (WORLD_SIZE=2)" in lines[0]
