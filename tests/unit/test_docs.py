"""The documents keep their shape: README.md is a guide of at most 350 lines with no CI run diary, every
benchmark figure it cites is on the benchmarks page (fsdp_jobs/bench/README.md), where measurements live, and
tests/README.md maps promises only to tests that exist. Reads text files only (no torch, no project import).

A benchmark figure, as checked here: a number with a unit (s, ms, us, %, x, KB, MB, GB, GiB, tokens/s) or with
a decimal point (a ratio such as 1.03), inside a README paragraph or table row that names the benchmarks page.
Such a paragraph says "this figure was measured, there"; the page must then hold it, written the same way."""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
BENCH_PAGE = REPO / "fsdp_jobs" / "bench" / "README.md"
TESTS_README = REPO / "tests" / "README.md"
MAX_README_LINES = 350

# a number (thousands commas, one decimal point at most; a version such as 2.13.0 is none), or a range of two,
# and its unit
NUMBER = r"(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?!\d|\.\d)"
FIGURE = re.compile(rf"(?<![\w.-])({NUMBER}(?:-{NUMBER})?)"
                    r"(?:\s?(ms|us|s|KB|MB|GB|GiB|tokens/s)(?![\w/])|(%|x)(?!\w))?")
# what a lab notebook leaves behind: CI run numbers, calendar dates, rehearsals, which machine was slow
DIARY = re.compile(r"\bCI ?\d+\b|\b20\d\d-\d\d-\d\d\b|\brehearsal|\bslow(?:er)? machine|\bslow hour", re.I)


def blocks(text: str) -> list[str]:
    """Paragraphs (blank-line separated, joined into one line) and table rows, each on its own."""
    out: list[str] = []
    para: list[str] = []
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            out.append(line)
        elif line.strip():
            para.append(line.strip())
            continue
        if para:
            out.append(" ".join(para))
            para = []
    return out


def figures(block: str) -> list[str]:
    """The benchmark figures of one block, as written (see the module's docstring)."""
    found = []
    for m in FIGURE.finditer(block):
        number, spaced, attached = m.groups()
        if spaced or attached or "." in number:
            found.append(number + (f" {spaced}" if spaced else attached or ""))
    return found


def on_the_page(figure: str, page: str) -> bool:
    """The figure as a whole figure of the page (1.72 s, not the end of 1.20-1.72 s nor the start of 1.72 ms)."""
    written = re.escape(figure).replace(r"\ ", r"\s?")
    return re.search(rf"(?<![\w.,-]){written}(?![\w%]|[.,-]\d)", page) is not None


def cited_figures_missing_from_the_page(readme: str, page: str) -> list[str]:
    return [f"{fig!r} in: {block[:100]}..." for block in blocks(readme) if "fsdp_jobs/bench/README.md" in block
            for fig in figures(block) if not on_the_page(fig, page)]


def test_the_readme_is_a_guide_of_at_most_350_lines_without_a_run_diary():
    lines = README.read_text().splitlines()
    assert len(lines) <= MAX_README_LINES, f"README.md has {len(lines)} lines, at most {MAX_README_LINES}"
    diary = [f"README.md:{n}: {line.strip()}" for n, line in enumerate(lines, 1) if DIARY.search(line)]
    assert not diary, "run diaries belong in commit messages, measurements on the benchmarks page:\n" + "\n".join(diary)


def test_every_benchmark_figure_the_readme_cites_is_on_the_benchmarks_page():
    readme = README.read_text()
    assert "fsdp_jobs/bench/README.md" in readme, "README.md no longer points to the benchmarks page"
    missing = cited_figures_missing_from_the_page(readme, BENCH_PAGE.read_text())
    assert not missing, "figures README.md cites that fsdp_jobs/bench/README.md does not hold:\n" + "\n".join(missing)


def test_figures_are_read_as_written_and_versions_and_counts_are_not_figures():
    block = "a step within 1.03 of a loop's, 1.72 s, 37,726 tokens/s at 31.4% and 0.82x; torch 2.13.0, 1,024 nodes"
    assert figures(block) == ["1.03", "1.72 s", "37,726 tokens/s", "31.4%", "0.82x"]
    assert figures("17-18 KB, 0.19-0.32 s, 3 -> 2 nodes") == ["17-18 KB", "0.19-0.32 s"]
    assert cited_figures_missing_from_the_page(
        "in 1.72 s (fsdp_jobs/bench/README.md)\n\nnot cited: 9.99 s\n", "recovery: 1.72 s, (1.2-2.6 s)") == []
    assert cited_figures_missing_from_the_page("0.32 s (fsdp_jobs/bench/README.md)\n", "0.19-0.32 s; 0.32 ms; 0.325 s") == [
        "'0.32 s' in: 0.32 s (fsdp_jobs/bench/README.md)..."]
    assert cited_figures_missing_from_the_page(
        "in 1.73 s (fsdp_jobs/bench/README.md)\n", "recovery: 1.72 s") == [
            "'1.73 s' in: in 1.73 s (fsdp_jobs/bench/README.md)..."]


def named_tests(cell: str) -> list[tuple[str, str]]:
    """(file, test name or '') for each `dir/test_x.py[::name]` and each `::name` after it in one table cell."""
    named: list[tuple[str, str]] = []
    current = ""
    for token in re.findall(r"(?:tests/)?(?:[a-z_]+/)+[\w.-]+\.py(?:::[\w*]+)?|::[\w*]+", cell):
        path, _, name = token.partition("::")
        if path:
            current = path.removeprefix("tests/")
        if current:
            named.append((current, name))
    return named


def test_the_promise_map_names_only_tests_that_exist():
    missing = []
    for row in TESTS_README.read_text().splitlines():
        if not row.startswith("|") or row.startswith("|---"):
            continue
        for path, name in named_tests(row.rstrip(" |").rsplit("|", 1)[-1]):
            source = REPO / "tests" / path
            if not source.is_file():
                missing.append(f"no file tests/{path}")
            elif name and not fnmatch.filter(re.findall(r"def (test_\w+)", source.read_text()), name):
                missing.append(f"no test {name} in tests/{path}")
    assert not missing, "tests/README.md names what does not exist:\n" + "\n".join(missing)
