"""Tool schemas from type hints and docstrings (transformers' get_json_schema), and argument checks."""

from typing import Literal

import pytest

from grpolab.env.schema import SchemaError, check_arguments, function_schema, prepare_arguments


def convert(value: float, unit: Literal["km", "mi"], digits: int = 2, tags: list[str] | None = None) -> str:
    """Convert a distance.

    Args:
        value: The distance.
        unit: The unit to convert to.
        digits: Decimal places.
        tags: Labels to attach.
    """
    return f"{value}{unit}"


SCHEMA = function_schema(convert)


def test_schema_is_openai_function_format():
    fn = SCHEMA["function"]
    assert SCHEMA["type"] == "function" and fn["name"] == "convert" and fn["description"] == "Convert a distance."
    assert fn["parameters"]["required"] == ["value", "unit"]
    assert fn["parameters"]["properties"]["unit"]["enum"] == ["km", "mi"]


def test_schema_errors_name_the_function_and_the_fix():
    def no_doc(x: int):
        return x

    def no_hint(x):
        """Do it.

        Args:
            x: a thing
        """

    def undocumented_arg(x: int, y: int):
        """Do it.

        Args:
            x: a thing
        """

    for fn, what in ((no_doc, "docstring"), (no_hint, "type hint"), (undocumented_arg, "'y'")):
        with pytest.raises(SchemaError) as e:
            function_schema(fn)
        msg = str(e.value)
        assert fn.__name__ in msg and what in msg and "Args:" in msg, msg
        assert isinstance(e.value, ValueError)


def test_valid_arguments_pass_and_int_becomes_float_for_number():
    assert check_arguments(SCHEMA, {"value": 3.5, "unit": "km"}) is None
    args, err = prepare_arguments(SCHEMA, {"value": 3, "unit": "mi", "digits": 1, "tags": None})
    assert err is None and args == {"value": 3.0, "unit": "mi", "digits": 1, "tags": None}
    assert type(args["value"]) is float and type(args["digits"]) is int
    assert check_arguments(SCHEMA["function"]["parameters"], {"value": 1, "unit": "km", "tags": ["a"]}) is None


@pytest.mark.parametrize(
    "arguments, message",
    [
        ({"unit": "km"}, "missing required argument 'value'"),
        ({"value": 1, "unit": "km", "colour": "red"}, "unknown argument 'colour'"),
        ({"value": "3", "unit": "km"}, "'value' must be a number, got a string"),
        ({"value": True, "unit": "km"}, "'value' must be a number, got True"),
        ({"value": 1, "unit": "m"}, "'unit' must be one of 'km', 'mi'"),
        ({"value": 1, "unit": "km", "digits": 2.0}, "'digits' must be an integer, got 2.0"),
        ({"value": 1, "unit": "km", "digits": False}, "'digits' must be an integer, got False"),
        ({"value": 1, "unit": "km", "tags": "a"}, "'tags' must be an array or null"),
        ({"value": 1, "unit": "km", "tags": ["a", 2]}, "'tags'[1] must be a string"),
        ({"value": None, "unit": "km"}, "'value' must be a number, got None"),
    ],
)
def test_bad_arguments_get_a_clear_message(arguments, message):
    err = check_arguments(SCHEMA, arguments)
    assert err is not None and message in err, err


def test_nested_objects_and_type_lists():
    schema = {
        "type": "object",
        "required": ["p"],
        "properties": {
            "p": {
                "type": "object",
                "required": ["x"],
                "properties": {"x": {"type": ["integer", "string"]}},
                "additionalProperties": False,
            },
            "m": {"type": "object", "additionalProperties": {"type": "number"}},
        },
    }
    assert check_arguments(schema, {"p": {"x": "a"}, "m": {"a": 1, "b": 2.5}}) is None
    assert "missing required key" in check_arguments(schema, {"p": {}})
    assert "unknown key" in check_arguments(schema, {"p": {"x": 1, "y": 2}})
    assert "must be a number" in check_arguments(schema, {"p": {"x": 1}, "m": {"a": "no"}})
    spec: dict = {"type": "integer"}
    value: object = 1
    for _ in range(30):  # a schema and a value nested deeper than the validator follows
        spec, value = {"type": "array", "items": spec}, [value]
    assert "nested too deeply" in check_arguments({"type": "object", "properties": {"d": spec}}, {"d": value})
