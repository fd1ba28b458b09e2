"""LaTeX export: a booktabs table whose every text pdflatex can typeset."""

from __future__ import annotations

import unicodedata

from .table import Table

_LATEX_SPECIALS = {
    "\\": r"\textbackslash{}", "_": r"\_", "%": r"\%", "&": r"\&", "#": r"\#", "$": r"\$",
    "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}",
    "<": r"\textless{}", ">": r"\textgreater{}", "[": "{[}", "]": "{]}",
    '"': r"\texttt{\char34}", "—": "---", "–": "--", "−": "-", "§": r"\S{}", "…": r"\ldots{}",
}
# Symbols typeset as math; \ensuremath so that two in a row never make "$$".
_LATEX_MATH = {
    "µ": r"\mu", "±": r"\pm", "↑": r"\uparrow", "↓": r"\downarrow", "→": r"\rightarrow",
    "←": r"\leftarrow", "×": r"\times", "·": r"\cdot", "≤": r"\leq", "≥": r"\geq", "≈": r"\approx",
    "≠": r"\neq", "∞": r"\infty", "‖": r"\|", "√": r"\surd", "∈": r"\in", "∇": r"\nabla",
    "∂": r"\partial", "⌈": r"\lceil", "⌉": r"\rceil", "⌊": r"\lfloor", "⌋": r"\rfloor",
    "⊙": r"\odot", "ℓ": r"\ell", "°": r"^\circ", "|": "|",
}
# Greek capitals with no LaTeX command look like Latin letters.
_GREEK_AS_LATIN = {"ALPHA": "A", "BETA": "B", "EPSILON": "E", "ZETA": "Z", "ETA": "H", "IOTA": "I",
                   "KAPPA": "K", "MU": "M", "NU": "N", "OMICRON": "O", "RHO": "P", "TAU": "T",
                   "CHI": "X"}
_GREEK = set(_GREEK_AS_LATIN) | {"GAMMA", "DELTA", "THETA", "LAMBDA", "XI", "PI", "SIGMA",
                                 "UPSILON", "PHI", "PSI", "OMEGA"}


def _latex_char(ch: str) -> str:
    """One character as pdflatex (utf8 input, default fonts) can typeset it."""
    if ch in _LATEX_SPECIALS:
        return _LATEX_SPECIALS[ch]
    if ch in _LATEX_MATH:
        return rf"\ensuremath{{{_LATEX_MATH[ch]}}}"
    if ch.isascii():
        return ch if ch.isprintable() else " "
    name = unicodedata.name(ch, "").replace("LAMDA", "LAMBDA")  # Unicode's spelling
    for prefix, capital in (("GREEK SMALL LETTER ", False), ("GREEK CAPITAL LETTER ", True)):
        letter = name[len(prefix):]
        if name.startswith(prefix) and letter in _GREEK:
            if letter in _GREEK_AS_LATIN and (capital or letter == "OMICRON"):
                return _GREEK_AS_LATIN[letter] if capital else "o"
            return rf"\ensuremath{{\{letter.capitalize() if capital else letter.lower()}}}"
    tag, _, code = unicodedata.decomposition(ch).partition(" ")
    if tag in ("<super>", "<sub>") and code:
        inner = "".join(_latex_char(chr(int(c, 16))) for c in code.split())
        return rf"\text{'superscript' if tag == '<super>' else 'subscript'}{{{inner}}}"
    if unicodedata.category(ch) == "Mn":
        return ""  # a combining mark: the base letter is kept, the accent dropped
    # Latin letters with accents: their ASCII base (é -> e); anything else -> "?"
    base = unicodedata.normalize("NFKD", ch).encode("ascii", "ignore").decode()
    return "".join(_latex_char(b) for b in base) if base else "?"


def latex_escape(s: str) -> str:
    """Text safe for a pdflatex document: specials escaped, symbols and Greek as math,
    sub/superscripts as text sub/superscripts; characters it cannot typeset become '?'."""
    return "".join(_latex_char(ch) for ch in s)


def render_latex(table: Table) -> str:
    """A booktabs ``tabular`` inside a ``table`` float (needs ``\\usepackage{booktabs}``)."""
    spec = "".join("r" if table.is_numeric(j) else "l" for j in range(len(table.columns)))
    out = [r"% requires \usepackage{booktabs}", r"\begin{table}[htbp]", r"\centering"]
    cap = ". ".join(t for t in (table.title, table.caption) if t)
    if cap:
        out.append(rf"\caption{{{latex_escape(' '.join(cap.split()))}}}")
    out.append(rf"\begin{{tabular}}{{{spec}}}")
    out.append(r"\toprule")
    out.append(" & ".join(latex_escape(" ".join(c.header_text().split()))
                          for c in table.columns) + r" \\")
    out.append(r"\midrule")
    for row in table.formatted_rows():
        out.append(" & ".join(latex_escape(" ".join(s.split())) for s in row) + r" \\")
    out.append(r"\bottomrule")
    out.append(r"\end{tabular}")
    notes = table.display_notes()
    if notes:
        out.append(r"\par\smallskip\footnotesize")
        out.append(r"\\ ".join(latex_escape(" ".join(n.split())) for n in notes))
    out.append(r"\end{table}")
    return "\n".join(out) + "\n"

