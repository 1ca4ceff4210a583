"""The README's and docs/' relative links reach a file, and a heading there where they name one (GitHub's
anchors: lowercase, punctuation dropped, spaces to hyphens), so moving a section cannot strand them."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchor(heading: str) -> str:
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """The anchors of `page`'s ATX headings (`#` lines), those in code fences (shell comments) left out."""
    out, fenced = set(), False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif line.startswith("#") and not fenced:
            out.add(anchor(line.lstrip("#")))
    return out


def relative_links(page: Path) -> list[tuple[Path, str]]:
    out = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:
        path, _, fragment = target.partition("#")
        out.append(((page.parent / path).resolve() if path else page, fragment))
    return out


def test_anchors_follow_githubs_rule():
    assert anchor("The AVX2 path (CPUs without AVX512-BF16)") == "the-avx2-path-cpus-without-avx512-bf16"
    assert anchor("A real pretrained pair: Qwen2.5-Coder 1.5B + 0.5B") == "a-real-pretrained-pair-qwen25-coder-15b--05b"


def test_a_comment_in_a_code_fence_is_no_heading(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Title\n```bash\n# run it\ntriforce bench\n```\n## Run it\n")
    assert anchors(page) == {"title", "run-it"}
    page.write_text("# Title\n```bash\n# run it twice\n```\n")
    assert anchors(page) == {"title"}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_relative_links_reach_their_file_and_heading(page):
    links = relative_links(page)
    missing = [str(path) for path, _ in links if not path.exists()]
    assert not missing, f"{page.name} links to files that do not exist: {missing}"
    stranded = [f"{path.name}#{fragment}" for path, fragment in links
                if fragment and path.suffix == ".md" and fragment not in anchors(path)]
    assert not stranded, f"{page.name} links to headings that do not exist: {stranded}"
