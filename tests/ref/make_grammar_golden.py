#!/usr/bin/env python3
"""Write tests/golden/grammar_cases.jsonl: GBNF grammars, strings, and whether
each string is a sentence of the grammar, decided by independent parsers:
Lark (Earley, scannerless: every terminal one character) for the
context-free grammars and Python's `re` (fullmatch) for the regular ones.
Each grammar is written twice by hand, once in GBNF (what dsq compiles) and
once in Lark / regex notation (what decides); dsq's verdict is never an
input. tests/unit/test_grammar.c compiles each GBNF and requires the same
verdict for every string, and for every accepted string that each prefix
is accepted as a prefix.

usage: tests/ref/.venv/bin/python tests/ref/make_grammar_golden.py [OUT]
needs: tests/ref/requirements-grammar.txt (lark)
"""
import json
import platform
import re
import sys

import lark

JSON_GBNF = r'''
root   ::= value
value  ::= object | array | string | number | ("true" | "false" | "null")
object ::= "{" ws ( string ws ":" ws value ws ( "," ws string ws ":" ws value ws )* )? "}"
array  ::= "[" ws ( value ws ( "," ws value ws )* )? "]"
string ::= "\"" ( [^"\\\x00-\x1f] | "\\" ( ["\\/bfnrt] | "u" [0-9a-fA-F]{4} ) )* "\""
number ::= "-"? ( "0" | [1-9] [0-9]* ) ( "." [0-9]+ )? ( [eE] [-+]? [0-9]+ )?
ws     ::= [ \t\n]*
'''
JSON_LARK = r'''
start: value
value: object | array | string | number | "true" | "false" | "null"
object: "{" ws ( string ws ":" ws value ws ( "," ws string ws ":" ws value ws )* )? "}"
array: "[" ws ( value ws ( "," ws value ws )* )? "]"
string: "\"" ( CHAR | "\\" ( ESC | "u" HEX HEX HEX HEX ) )* "\""
number: "-"? ( "0" | NZ DIGIT* ) ( "." DIGIT+ )? ( EXP SIGN? DIGIT+ )?
ws: WS*
CHAR: /[^"\\\x00-\x1f]/
ESC: /["\\\/bfnrt]/
HEX: /[0-9a-fA-F]/
NZ: /[1-9]/
DIGIT: /[0-9]/
EXP: /[eE]/
SIGN: /[-+]/
WS: /[ \t\n]/
'''

CASES = [
    {
        "name": "arithmetic",
        "gbnf": r'''
root   ::= expr
expr   ::= term (("+" | "-") term)*
term   ::= factor (("*" | "/") factor)*
factor ::= [0-9]+ | "(" expr ")"
''',
        "lark": r'''
start: expr
expr: term (("+" | "-") term)*
term: factor (("*" | "/") factor)*
factor: DIGIT+ | "(" expr ")"
DIGIT: /[0-9]/
''',
        "strings": ["1", "12+3", "(1+2)*3", "1+", "", "((2))", "2*(3", "10/2-3", "a",
                    "1++2", "((((((1))))))", "(1)(2)", "7*(8+9)/(1-2)", "007"],
    },
    {
        "name": "json",
        "gbnf": JSON_GBNF,
        "lark": JSON_LARK,
        "strings": ['{}', '{"a": 1}', '{"a":1,}', '[1, 2.5, -3e+2, true, null]',
                    '"caf\u00e9"', '"\u65e5\u672c\u8a9e"', '"\U0001F600"', '"a\\u00e9b"',
                    '"a\\u00eb', '"tab\there"', '"bad \\q"', '01', '-0.5E-7', '[[[]]]',
                    '{"k": {"k2": [1, {"x": "y"}]}}', '{"a" 1}', 'nul', 'null ',
                    ' {}', '[1 2]', '{"\\"": "\\\\"}', '-', '1.', '.5'],
    },
    {
        "name": "balanced",
        "gbnf": r'''
root ::= p
p    ::= "(" p ")" p |
''',
        "lark": r'''
start: p
p: ("(" p ")" p)?
''',
        "strings": ["", "()", "(())()", "(()", ")(", "((()())())", "()()()", "(((", "())"],
    },
    {
        "name": "common_prefixes",
        "gbnf": r'''
# alternatives that share prefixes; a rule split over lines
root ::= "ab"
       | "abc"
       | "a" "b"+ "d"
       | x "z"
x    ::= "a"? "b"?
''',
        "lark": r'''
start: "ab" | "abc" | "a" B+ "d" | x "z"
x: A? B?
A: "a"
B: "b"
''',
        "strings": ["ab", "abc", "abd", "abbbd", "ad", "z", "az", "bz", "abz", "abbz", "a",
                    "abcd", ""],
    },
    {
        "name": "nested_groups",
        "gbnf": r'''root ::= ((("x" | "y")))+ (("-" (("z")))){0,2}''',
        "lark": r'''
start: ((X | Y))+ ("-" "z")~0..2
X: "x"
Y: "y"
''',
        "strings": ["x", "xyx", "x-z", "y-z-z", "x-z-z-z", "-z", "xy-", ""],
    },
]

REGEX_CASES = [
    {
        "name": "counts",
        "gbnf": r'''root ::= "a"{2,4} "b"{3} "c"{1,} "d"? ("e" "f"){0,1}''',
        "re": r"a{2,4}b{3}c+d?(?:ef)?",
        "strings": ["aabbbc", "aaaabbbcccd", "abbbc", "aaaaabbbc", "aabbc", "aabbbcdef",
                    "aabbbcef", "aabbbcdf", "aabbb"],
    },
    {
        "name": "classes_unicode",
        "gbnf": r'''root ::= [^a-z\u00e9]+ [\u03b1-\u03c9] [\U0001F600-\U0001F64F]?''',
        "re": "[^a-z\u00e9]+[\u03b1-\u03c9][\U0001F600-\U0001F64F]?",
        "strings": ["A\u03b1", "ZZ\u03c9\U0001F600", "a\u03b1", "\u00e9\u03b1",
                    "\u00ea\u03b2", "1\n\u03b3", "\u03b1", "X\u03b1\U0001F650", "X\u03b1\U0001F64F"],
    },
    {
        "name": "dot",
        "gbnf": r'''root ::= "<" .* ">"''',
        "re": r"<.*>",
        "strings": ["<>", "<a>", "<a>b>", "<\n>", "<", "a<>", "<\u00e9\U0001F600>", "<>>"],
    },
    {
        "name": "escapes",
        "gbnf": r'''root ::= "\x41\u00e9\t" [\]\-\\] "\"" [\^a]''',
        "re": "A\u00e9\t[\\]\\-\\\\]\"[\\^a]",
        "strings": ["A\u00e9\t]\"^", "A\u00e9\t-\"a", "A\u00e9\t\\\"a", "A\u00e9\t]\"b",
                    "A\u00e9 ]\"a", "Ae\t]\"a"],
    },
    {
        "name": "alternation_star",
        "gbnf": r'''root ::= ("cat" | "car" | "c" [a-z])* "!"''',
        "re": r"(?:cat|car|c[a-z])*!",
        "strings": ["!", "cat!", "carcatcz!", "ca!", "cxcy!", "cat", "catt!", "cacar!"],
    },
]


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/golden/grammar_cases.jsonl"
    lines = [
        "# dsq golden file, format_version: 1",
        "# what: GBNF grammars and strings with their membership decided by independent "
        "parsers (Lark Earley for context-free, Python re.fullmatch for regular)",
        "# regenerate: tests/ref/.venv/bin/python tests/ref/make_grammar_golden.py",
        f"# tools: lark {lark.__version__}, python {platform.python_version()}",
        "# tolerance: exact (accepted must equal the reference's verdict for every string)",
        "# format: one JSON object per line: name, gbnf, reference ('lark' or 're'), "
        "cases: [[string, accepted], ...]",
    ]
    n = 0
    for c in CASES:
        parser = lark.Lark(c["lark"], parser="earley", lexer="dynamic_complete",
                           ambiguity="resolve")
        rows = []
        for s in c["strings"]:
            try:
                parser.parse(s)
                ok = True
            except lark.exceptions.LarkError:
                ok = False
            rows.append([s, ok])
        assert any(r[1] for r in rows) and not all(r[1] for r in rows), c["name"]
        lines.append(json.dumps({"name": c["name"], "gbnf": c["gbnf"], "reference": "lark",
                                 "cases": rows}, ensure_ascii=True))
        n += len(rows)
    for c in REGEX_CASES:
        rx = re.compile(c["re"], re.DOTALL)
        rows = [[s, rx.fullmatch(s) is not None] for s in c["strings"]]
        assert any(r[1] for r in rows) and not all(r[1] for r in rows), c["name"]
        lines.append(json.dumps({"name": c["name"], "gbnf": c["gbnf"], "reference": "re",
                                 "cases": rows}, ensure_ascii=True))
        n += len(rows)
    with open(out, "w", encoding="ascii") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {out}: {len(CASES) + len(REGEX_CASES)} grammars, {n} strings")


if __name__ == "__main__":
    main()
