#!/usr/bin/env python3
"""Write tests/golden/schema_cases.jsonl: JSON Schemas and regexes with
instances whose verdicts come from references that share nothing with dsq,
Python's `jsonschema` (Draft 2020-12 validator with that draft's FORMAT_CHECKER) and
Python's `re.fullmatch`. tests/unit/test_grammar_schema.c reads it:

  {"schema": S, "ok": [texts], "other": [texts], "valid": [bools]}
      every text of "ok" is valid (checked here) and the grammar of S must
      accept it; a text of "other" the grammar accepts must be valid
      ("valid" is jsonschema's verdict on each, in order);
  {"regex": R, "strings": [texts], "match": [bools]}
      the grammar of R accepts exactly the strings re.fullmatch accepts
      (with re.ASCII: dsq's \d \w \s are ASCII classes).

Usage: tests/ref/make_schema_golden.py [OUT] (default
tests/golden/schema_cases.jsonl). Needs jsonschema (tests/requirements.txt).
"""
import json
import re
import sys

import jsonschema

C = dict(separators=(",", ":"), ensure_ascii=False)


def dump(v, pretty=False):
    return json.dumps(v, indent=2, ensure_ascii=False) if pretty else json.dumps(v, **C)


def verdict(schema, text):
    try:
        inst = json.loads(text)
    except ValueError:
        return False
    v = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
    return v.is_valid(inst)


PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "email": {"type": "string", "format": "email"},
        "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b", "c"]},
                 "minItems": 1, "maxItems": 3},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}

TREE = {
    "$defs": {"node": {"type": "object", "properties": {
        "v": {"type": "integer"},
        "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2}},
        "required": ["v"]}},
    "$ref": "#/$defs/node",
}

SCHEMAS = [
    # (schema, ok instances (python values or raw text), other texts)
    ({"type": "integer", "minimum": -17, "maximum": 342},
     [-17, -9, 0, 5, 99, 100, 342],
     ["-18", "343", "-0", "007", "1000", "12.5", "-170", "34", "341", "-1", "\"3\""]),
    ({"type": "integer", "exclusiveMinimum": 9, "exclusiveMaximum": 101},
     [10, 55, 99, 100], ["9", "101", "1000", "0", "-5"]),
    ({"type": "integer", "minimum": 1000}, [1000, 1001, 9999, 10000, 123456789],
     ["999", "0", "-1000", "100"]),
    ({"type": "integer", "maximum": -5}, [-5, -6, -100, -999999],
     ["-4", "0", "5", "-0"]),
    ({"type": "number", "minimum": -2, "maximum": 3},
     [-2, -1.5, -0.25, 0, 0.5, 2.999, 3],
     ["3.5", "-2.5", "-3", "4", "3.0001", "-2.0001", "1e2", "2.5", "-1.999"]),
    ({"type": "number", "minimum": 10},
     [10, 10.5, 99.25, 1234], ["9.99", "-10", "0", "1e3", "10.0"]),
    ({"type": "string", "minLength": 2, "maxLength": 4},
     ["ab", "abc", "abcd", "ÿé", "a\"b"],
     ["\"a\"", "\"abcde\"", "\"\"", "\"\\ud83d\\ude00x\"", "\"\\u00e9\\u00e9\""]),
    ({"type": "string", "pattern": "^[a-z]+[0-9]{2}$"},
     ["abc12", "z00"], ["\"abc1\"", "\"ABC12\"", "\"abc123\"", "\"12\""]),
    ({"type": "string", "pattern": "[0-9]{3}"},
     ["123", "x123y", "a\"123"], ["\"12\"", "\"ab\"", "\"1 2 3\""]),
    ({"type": "string", "pattern": "^(\\+|-)?\\d+(\\.\\d+)?$"},
     ["12", "+1.5", "-0.25"], ["\"1.\"", "\".5\"", "\"+-1\""]),
    # inside a JSON string: '"' and '\\' as escapes, raw control characters never
    ({"type": "string", "pattern": "^[^0-9]+$"},
     ["ab", "a\"b", "a\\b", "tab\there"], ["\"a\u0001b\"", "\"a\nb\"", "\"a1\"", "\"a\\\""]),
    # jsonschema runs Python's re in Unicode mode: the complement of \d (or of
    # a class holding it) must not take the non-ASCII digits
    ({"type": "string", "pattern": "^\\D+$"}, ["ab", "a b"], ["\"\u0663\"", "\"a1\""]),
    ({"type": "string", "pattern": "^[^\\d\\s]+$"}, ["ab"], ["\"\u0663\"", "\"a b\""]),
    ({"type": "string", "pattern": "^.{2}$"}, ["ab", "\"\\"], ["\"a\nb\"", "\"a\u0009\""]),
    # a pattern that needs a control character: JSON's \u00XX escape of it
    # (lowercase hex as Python writes it); the raw character is not JSON
    ({"type": "string", "pattern": "^a[\\x00-\\x08\\x1f]b$"}, ["a\u0001b", "a\u0000b", "a\u001fb"],
     ["\"ab\"", "\"a\u0001b\"", "\"a\\u0009b\""]),
    ({"type": "string", "format": "date"},
     ["2024-01-31", "1999-12-28", "2023-04-30", "2023-02-28"],
     ["\"2024-13-01\"", "\"2024-1-01\"", "\"20240101\"", "\"2023-02-30\"", "\"2023-04-31\"",
      "\"2023-06-31\"", "\"2023-00-10\"", "\"2023-01-00\"", "\"2023-01-32\""]),
    ({"type": "string", "format": "date-time"},
     ["2024-01-31T23:59:59Z", "1999-12-28T00:00:00.123+05:30"],
     ["\"2024-01-31 23:59:59Z\"", "\"2024-01-31T24:00:00Z\"", "\"2024-01-31T23:59:59\""]),
    ({"type": "string", "format": "time"}, ["23:59:59Z", "00:00:00.5-01:00"], ["\"23:59\""]),
    ({"type": "string", "format": "uuid"},
     ["123e4567-e89b-12d3-a456-426614174000"], ["\"123e4567e89b12d3a456426614174000\""]),
    ({"type": "string", "format": "ipv4"},
     ["192.168.0.1", "255.255.255.255", "0.0.0.0"],
     ["\"256.1.1.1\"", "\"01.2.3.4\"", "\"1.2.3\""]),
    ({"type": "string", "format": "email"}, ["a.b@example.com"], ["\"ab.example.com\""]),
    ({"enum": ["red", "green", 3, None, {"a": [1, 2]}]},
     ["red", "green", 3, None, {"a": [1, 2]}], ["\"blue\"", "4", "{\"a\":[1]}"]),
    ({"type": "string", "enum": ["x", 1, "y"]}, ["x", "y"], ["1"]),
    ({"const": "fixed"}, ["fixed"], ["\"fixe\""]),
    ({"type": ["string", "null"], "maxLength": 3}, ["ab", None], ["\"abcd\"", "3"]),
    ({"type": "boolean"}, [True, False], ["\"true\"", "1", "null"]),
    ({"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9},
      "minItems": 2, "maxItems": 3},
     [[1, 2], [0, 0, 9]], ["[1]", "[1,2,3,4]", "[10,1]", "[]"]),
    ({"type": "array", "items": {"type": "boolean"}}, [[], [True], [False, True, False]],
     ["[1]", "[true,]"]),
    ({"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}]},
     [["a", 1]], ["[\"a\"]", "[1,\"a\"]", "[\"a\",1,2]"]),
    (PERSON,
     [{"name": "Ann", "age": 31}, {"name": "Bo", "age": 0, "tags": ["a", "c"]},
      {"name": "Cy", "age": 150, "email": "c@d.org", "tags": ["b"]}],
     ['{"age":31,"name":"Ann"}', '{"name":"","age":1}', '{"name":"Ann"}',
      '{"name":"Ann","age":151}', '{"name":"Ann","age":3,"x":1}',
      '{"name":"Ann","age":3,"tags":[]}', '{"name":"Ann","age":3,"tags":["d"]}']),
    (TREE,
     [{"v": 1}, {"v": 1, "kids": [{"v": 2}, {"v": 3, "kids": []}]}],
     ['{"kids":[]}', '{"v":1,"kids":[{"v":2},{"v":3},{"v":4}]}', '{"v":"1"}']),
    ({"anyOf": [{"type": "integer", "minimum": 5}, {"type": "string", "maxLength": 1}]},
     [5, 77, "a"], ["4", "\"ab\""]),
    ({"oneOf": [{"type": "integer"}, {"type": "null"}]}, [3, None], ["\"3\""]),
    ({"allOf": [{"$ref": "#/$defs/p"}], "$defs": {"p": {"type": "integer", "maximum": 3}}},
     [3, -1], ["4"]),
    ({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"},
                                      "c": {"type": "integer"}}},
     [{}, {"a": 1}, {"b": 2}, {"a": 1, "c": 3}, {"a": 1, "b": 2, "c": 3}],
     ['{"a":"x"}', '{,}', '{"a":1,}']),
    ({"type": "object", "additionalProperties": {"type": "integer", "maximum": 1}},
     [{}, {"k": 1, "j": -3}], ['{"k":2}', '{"k":"1"}']),
    ({"type": "object", "required": ["id"]}, [{"id": [1, {"x": None}]}], ['{}']),
    (True, [1, "s", [None], {"a": {}}], ["nul"]),
    ({"description": "any value, annotated", "title": "t"}, [1.5, "x"], []),
]

REGEXES = [
    ("[a-c]{2,3}x?", ["ab", "abc", "abcx", "cc", "a", "abcd", "abx", ""]),
    ("^(foo|ba[rz])+$", ["foo", "barbaz", "foobarfoo", "fo", "bar ", "baq", ""]),
    ("\\d{3}-\\d{4}", ["555-1234", "55-1234", "555-12345", "abc-defg"]),
    ("[^aeiou\\s]+", ["xyz", "bcd", "a", "b c", "ü", "\"\\"]),
    ("(?:ab|cd)*e?", ["", "e", "abcde", "abab", "abc", "ee"]),
    ("a.c", ["abc", "a c", "a\nc", "ac", "a\u00e9c"]),
    ("\\w+@\\w+\\.com", ["bob@mail.com", "b@m.com", "bob@mail.org", "@m.com"]),
    ("x{0}y|z{1,}", ["y", "z", "zzz", "xy", ""]),
    ("(?P<year>[0-9]{4})-(0[1-9]|1[0-2])", ["2024-01", "2024-12", "2024-13", "24-01"]),
    ("[\\-+]?[0-9]+(\\.[0-9]*)?", ["-1", "+2.", "3.14", ".5", "1-"]),
    ("\\x41\\u00e9[\\t ]\\.", ["Aé .", "Aé\t.", "Ae .", "Aé  ."]),
    ("a{2}b{,3}", ["aab{,3}", "aab", "aa"]),
    ("\\$\\^|a\\|b", ["$^", "a|b", "a", "b"]),
    ("[]a]+|[^]]", ["]a]", "x", "]", "ab"]),
]


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/golden/schema_cases.jsonl"
    lines = []
    for schema, ok, other in SCHEMAS:
        ok_text = [dump(v) for v in ok]
        if ok and len(ok) > 1:
            ok_text.append(dump(ok[-1], pretty=True)[:4000])
        for t in ok_text:
            if not verdict(schema, t):
                raise SystemExit(f"not valid: {t} against {schema}")
        lines.append({"schema": schema, "ok": ok_text, "other": other,
                      "valid": [verdict(schema, t) for t in other]})
    for rx, strings in REGEXES:
        lines.append({"regex": rx, "strings": strings,
                      "match": [re.fullmatch(rx, s, re.ASCII) is not None for s in strings]})
    with open(out, "w", encoding="utf-8") as f:
        f.write("# made by tests/ref/make_schema_golden.py (jsonschema "
                f"{__import__('importlib.metadata').metadata.version('jsonschema')}, "
                "Python re); one case a line\n")
        for line in lines:
            f.write(json.dumps(line, ensure_ascii=False) + "\n")
    print(f"wrote {out}: {len(SCHEMAS)} schemas, {len(REGEXES)} regexes")


if __name__ == "__main__":
    main()
