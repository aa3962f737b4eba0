"""CPU tier: the README and the user docs stay true.

Citation form, which these tests check: a number quoted from a results JSON
is a Markdown link to that JSON whose title names the row and the method,

    [2.79](benchmarks/results/allreduce_h200x2_bfloat16.json "bytes=4096 method=symnccl:auto(tensor)")

(the row with that "bytes", the method's median "us"; the number must equal
it to the decimals shown). Every other relative link, and every path in
backquotes under benchmarks/, csrc/, docs/, examples/, scripts/, symnccl/
or tests/, must exist. A code block preceded by `<!-- file: PATH -->` must
be that file, verbatim.
"""
import json
import os
import re

import pytest

import symnccl
from symnccl import _C

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# the pages this test holds to the citation rules
PAGES = ["README.md", "docs/BUILD.md", "docs/FAILURES.md",
         "docs/FRAMEWORKS.md", "docs/RELEASE.md", "docs/PERFORMANCE.md",
         "docs/ARCHITECTURE.md"]
LINK = re.compile(r"\[([^\]]*)\]\(([^)\s]+)(?:\s+\"([^\"]*)\")?\)")
CITED_NUMBER = re.compile(r"^-?\d+(?:\.\d+)?$")
TICKED_PATH = re.compile(
    r"`((?:benchmarks|csrc|docs|examples|scripts|symnccl|tests|tools)/[^`\s]+)`")


def _read(page):
    with open(os.path.join(ROOT, page)) as f:
        return f.read()


def _target(page, href):
    """The file a relative link of `page` names (fragment dropped)."""
    path = href.split("#", 1)[0]
    return os.path.normpath(os.path.join(ROOT, os.path.dirname(page), path))


@pytest.mark.parametrize("page", PAGES)
def test_every_relative_link_names_an_existing_file(page):
    missing = []
    for _, href, _ in LINK.findall(_read(page)):
        if re.match(r"^[a-z]+:", href) or href.startswith("#"):
            continue
        if not os.path.exists(_target(page, href)):
            missing.append(href)
    assert not missing, f"{page} links to missing files: {missing}"


@pytest.mark.parametrize("page", PAGES)
def test_every_path_in_backquotes_exists(page):
    missing = []
    for path in TICKED_PATH.findall(_read(page)):
        if any(c in path for c in "*{<"):   # a pattern, not a file
            continue
        if not os.path.exists(os.path.join(ROOT, path.split(":")[0])):
            missing.append(path)
    assert not missing, f"{page} names missing paths: {missing}"


def _json_citations(page):
    out = []
    for text, href, title in LINK.findall(_read(page)):
        if href.split("#")[0].endswith(".json") and CITED_NUMBER.match(text):
            out.append((text, href, title))
    return out


def _cited_value(page, href, title):
    where = dict(kv.split("=", 1) for kv in title.split())
    assert set(where) == {"bytes", "method"}, (page, title)
    with open(_target(page, href)) as f:
        doc = json.load(f)
    rows = [r for r in doc["rows"] if r["bytes"] == int(where["bytes"])]
    assert len(rows) == 1, (href, title)
    cell = rows[0][where["method"]]
    assert cell["wrong"] == 0, (href, title, cell)
    return cell["us"]


@pytest.mark.parametrize("page", PAGES)
def test_numbers_quoted_from_a_json_match_it(page):
    for text, href, title in _json_citations(page):
        assert title, f"{page}: [{text}]({href}) names no row and method"
        value = _cited_value(page, href, title)
        decimals = len(text.split(".")[1]) if "." in text else 0
        assert f"{value:.{decimals}f}" == text, \
            f"{page}: {text} cited from {href} ({title}) is {value}"


def test_readme_table_cites_its_numbers():
    """The front page's comparison table: every number in it is a JSON
    citation (three sizes, symnccl and two anchors at least)."""
    assert len(_json_citations("README.md")) >= 9


@pytest.mark.parametrize("page", PAGES)
def test_code_blocks_marked_as_files_are_those_files(page):
    text = _read(page)
    for path, block in re.findall(
            r"<!-- file: (\S+) -->\n```\w*\n(.*?)```", text, re.S):
        assert block == _read(path), f"{page}: the block of {path} differs"


def test_readme_is_a_front_page():
    lines = _read("README.md").splitlines()
    assert len(lines) <= 250, len(lines)
    text = "\n".join(lines)
    # the commands .ci/run runs: install, test; and the main job
    ci = _read(".ci/run")
    assert 'pip install -q -e ".[test]"' in ci
    assert 'pip install -e ".[test]"' in text
    assert "python3 -m pytest -q -rs tests" in ci
    assert "python -m pytest -q -rs tests" in text
    assert "python -m symnccl " in text


def _algo_list(doc):
    """The quoted names in a docstring's 'algo:' paragraph."""
    start = doc.index("algo:")
    end = doc.find("\n\n", start)
    return set(re.findall(r"'(\w+)'", doc[start:end if end > 0 else None]))


def test_all_reduce_docstring_lists_every_algorithm():
    doc = symnccl.Communicator.all_reduce.__doc__
    assert _algo_list(doc) == set(_C.ALGORITHMS) | {"auto"}


@pytest.mark.parametrize("coll", sorted(_C.COLLECTIVE_KERNELS))
def test_collective_docstring_lists_its_kernels_nccl_and_auto(coll):
    doc = getattr(symnccl.Communicator, coll).__doc__
    assert _algo_list(doc) == set(_C.COLLECTIVE_KERNELS[coll]) | \
        {"nccl", "auto"}, doc
    # auto is a table over symnccl's kernels and NCCL, not NCCL alone
    assert "'nccl' and 'auto' run" not in doc
    assert "symnccl.AUTO_TABLE" in doc


def _table_names(page, heading):
    """The `NAME`s in the first column of the table under `heading`."""
    text = _read(page)
    part = text[text.index(heading):]
    part = part[:part.find("\n## ", 1) if "\n## " in part[1:] else None]
    names = set()
    for line in part.splitlines():
        if line.startswith("| `"):
            first = line.split("|")[1]
            names |= set(re.findall(r"`([A-Z][A-Z0-9_<>a-z]*)`", first))
    return names


def test_build_md_run_time_knob_table_is_the_knob_table():
    """Every knob of the C table (registry.c, _C.KNOBS) has its row in
    docs/BUILD.md and the table names no other (SYMNCCL_RMSNORM_CTAS and
    SYMNCCL_RMSNORM_LOCAL_CTAS were missing)."""
    assert _table_names("docs/BUILD.md", "## Run-time knobs") == \
        set(_C.KNOBS)


def test_build_md_build_knob_table_is_what_setup_py_reads():
    """Every environment variable setup.py reads has its row, and the
    table names no other."""
    src = _read("setup.py")
    read = {m.replace("{minor}", "<minor>") for m in re.findall(
        r'environ\.get\(\s*f?"([A-Za-z0-9_{}]+)"', src)}
    assert len(read) > 10
    assert _table_names("docs/BUILD.md", "## Build knobs") == read


def _proven():
    """The libraries whose pair with the build the import picks for them
    has passed on two GPUs (csrc/runtime/nccl_policy.c's proofs)."""
    builds = tuple(sorted(_C.NCCL_DEVICE_API_HEADERS.values()))

    def code(v):
        a, b, c = (int(x) for x in v.split("."))
        return a * 10000 + b * 100 + c

    def proven(v):
        pick = _C._nccl_pick_build(code(v), builds)
        if not isinstance(pick, int):
            return False
        return _C._nccl_multi_gpu_caveat(code(v), builds[pick]) is None
    return proven


def test_readme_says_passed_exactly_where_a_two_gpu_run_passed():
    """The install section's NCCL list follows the proofs table: a library
    reads 'passed' only where its pair with the build that runs on it has
    passed on two GPUs, and 'not yet' only where it has not."""
    proven = _proven()
    text = " ".join(_read("README.md").split())
    said = re.findall(r"(2\.\d+\.\d+), (passed|not yet)", text)
    assert len(said) >= 4, said
    for version, verdict in said:
        assert (verdict == "passed") == proven(version), (version, verdict)


def test_failures_md_table_says_passed_exactly_where_a_run_passed():
    proven = _proven()
    rows = [line.split("|") for line in _read("docs/FAILURES.md").splitlines()
            if re.match(r"\| .* \| 2\.\d+\.\d+ \| 2\.\d+\.\d+ \|", line)]
    assert len(rows) >= 5, rows
    for row in rows:
        library, check = row[2].strip(), row[4].strip()
        assert check.startswith("passed") == proven(library), row


def test_architecture_layer_table_is_symnccl_h_s_layers():
    """ARCHITECTURE.md's 'Host code' table lists the layers symnccl.h's
    header comment declares (tests/layering.py): the same files, in the
    same layers, in the same order."""
    from layering import layers
    text = _read("docs/ARCHITECTURE.md")
    table = text[text.index("| layer | files | what |"):]
    rows = []
    for line in table.splitlines()[2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows.append((int(cells[0]),
                     [f[:-2] for f in re.findall(r"`([\w/]+\.c)`",
                                                 cells[1])]))
    assert rows == layers()
