"""JSON schema to grammar against llama.cpp's converter: the same GBNF text, or the same refusal, for
each schema of tests/data/grammar/json_schema_grammars.json (made by make_json_schema_reference.py
with llama.cpp's json_schema_to_grammar), and schema-valid JSON accepted by the grammar."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

try:
    import jsonschema
except ImportError:  # not a dependency: the grammar checks run without it
    jsonschema = None

from pyggml.llm.grammar import LlamaGrammar
from pyggml.llm.grammar.json_schema import JsonSchemaError, json_schema_to_grammar

DATA = Path(__file__).parent.parent / "data" / "grammar"
CASES = json.loads((DATA / "json_schema_grammars.json").read_text(encoding="utf-8"))


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_conversion_matches_llama_cpp(case: dict) -> None:
    warnings: list[str] = []
    if "error" in case:
        with pytest.raises(JsonSchemaError) as e:
            json_schema_to_grammar(case["schema"], warn=warnings.append)
        assert str(e.value) == case["error"]
        return
    grammar = json_schema_to_grammar(case["schema"], warn=warnings.append)
    assert grammar == case["grammar"]
    assert warnings == ([f"JSON schema conversion was incomplete: {case['warning']}"] if "warning" in case else [])
    LlamaGrammar.from_text(grammar)  # and it is a grammar llama.cpp's parser takes


#: (schema, instances that fit, instances that do not), the texts as the model would write them
INSTANCES = [
    ({"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 18}},
      "required": ["name"], "additionalProperties": False},
     ['{"name": "Ann"}', '{"name": "Bo", "age": 18}', '{ "name":"x","age":120 }'],
     ['{"age": 20}', '{"name": "Bo", "age": 17}', '{"name": "Bo", "extra": 1}', '{"name": "Bo",}']),
    ({"type": "array", "items": {"enum": ["a", "b"]}, "minItems": 1, "maxItems": 2},
     ['["a"]', '["b", "a"]'], ["[]", '["a", "b", "a"]', '["c"]']),
    ({"type": "string", "format": "date"}, ['"2024-02-29"'], ['"2024-13-01"', '"24-01-01"']),
    ({"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3}$"}, ['"AB-123"'], ['"AB-12"', '"ab-123"']),
    ({"type": "integer", "minimum": -5, "maximum": 300}, ["-5", "0", "300", "42"], ["-6", "301", "007"]),
]


@pytest.mark.parametrize("schema,good,bad", INSTANCES)
def test_grammar_accepts_what_the_schema_accepts(schema: dict, good: list[str], bad: list[str]) -> None:
    grammar = LlamaGrammar.from_text(json_schema_to_grammar(schema))
    for text in good:
        if jsonschema is not None:  # the instances themselves are right (jsonschema is optional)
            jsonschema.validate(json.loads(text), schema)
        assert grammar.copy().validate(text)[0], text
    for text in bad:
        assert not grammar.copy().validate(text)[0], text
