"""docs/tuning.md's table of study keys, generated from the study file's dataclasses.

    python -m training_harness.study.keys_doc [docs/tuning.md]

rewrites the table between BEGIN and END; tests/test_study_keys.py fails while the
file's table differs from what this writes.
"""

from __future__ import annotations

import sys
from pathlib import Path

from training_harness.study.keys import section_doc, sections, study_keys

BEGIN, END = "<!-- keys:begin -->", "<!-- keys:end -->"
DOC = Path(__file__).resolve().parents[2] / "docs" / "tuning.md"
COMMAND = "python -m training_harness.study.keys_doc"


def markdown() -> str:
    """One table per section: key, type, default, meaning."""
    heads = {name: section_doc(cls) for name, cls in sections()}
    lines = [f"<!-- generated from the study file's dataclasses by `{COMMAND}` -->"]
    for key in study_keys():
        if key.section in heads:
            head = f"`[{key.section}]`" if key.section else "Top level"
            lines += ["", f"**{head}**: {_text(heads.pop(key.section))}", "",
                      "| key | type | default | meaning |", "| --- | --- | --- | --- |"]
        default = key.default if key.default.startswith("(") else f"`{key.default}`"
        lines.append(f"| `{key.name}` | {_text(key.type)} | {_cell(default)} "
                     f"| {_text(key.doc)} |")
    return "\n".join(lines)


def with_table(text: str) -> str:
    """`text` with the table between the markers replaced by the current one."""
    if text.count(BEGIN) != 1 or text.count(END) != 1 or text.index(BEGIN) > text.index(END):
        raise ValueError(f"expected one {BEGIN} line before one {END} line")
    head, rest = text.split(BEGIN)
    return f"{head}{BEGIN}\n{markdown()}\n{END}{rest.split(END)[1]}"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")  # a table cell's end, even inside `code`


def _text(text: str) -> str:
    return _cell(text).replace("<", "\\<")  # runs/<name>/ is no HTML tag


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    path = Path(args[0]) if args else DOC
    text = path.read_text()
    new = with_table(text)
    if new != text:
        path.write_text(new)
    print(f"{path}: key table {'rewritten' if new != text else 'already current'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
