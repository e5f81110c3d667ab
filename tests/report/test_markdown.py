"""What a report prints from a record (a path, a name, a status, a device) is text in its Markdown:
grassflow.markdown.text, rendered by CommonMark (with tables and strike-through, as Markdown viewers
render them), shows exactly that text, in a sentence and in a table cell, and no markup or HTML."""

from __future__ import annotations

from html import escape

from markdown_it import MarkdownIt

from grassflow import markdown

NASTY = [
    "_lease_+1@a,b~c",
    "a_b_c",
    "x|y",
    "<script>alert(1)</script>",
    "**bold** *it*",
    "[link](http://x)",
    "![img](x.png)",
    "`code`",
    "# heading",
    "a\\b",
    "&amp;",
    "~~struck~~",
    "{braces}",
    "NVIDIA H200 | 141 GB",
    "line\nbreak\ttab",
]
RENDER = MarkdownIt("commonmark").enable("table").enable("strikethrough")


def test_a_records_string_renders_as_itself():
    for s in NASTY:
        html = RENDER.render(f"the run {markdown.text(s)} here")
        shown = s.replace("\n", " ").replace("\t", " ")
        assert html == f"<p>the run {escape(shown, quote=False)} here</p>\n", (s, html)


def test_a_cell_stays_one_cell():
    rows = markdown.table(["run", "device"], [[markdown.text("a|b"), markdown.text("x|y|z")]])
    html = RENDER.render("\n".join(rows))
    assert html.count("<td>") == 2 and "<td>a|b</td>" in html and "<td>x|y|z</td>" in html, html


def test_a_code_span_holds_no_backtick():
    assert (
        RENDER.render(f"commit {markdown.code('ab`<b>c')}")
        == "<p>commit <code>ab'&lt;b&gt;c</code></p>\n"
    )
