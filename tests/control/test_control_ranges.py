"""fastpath._ranges.parse_ranges: a range past any list's size and non-ASCII digits are refused
with a message naming the list and the part."""

import pytest


def test_range_parser_refuses_a_range_past_any_list_and_non_ascii_digits():
    """Defect guarded: a range such as "0-1110000000" was expanded until memory ran out, and
    non-ASCII digits ("²") passed the digit check into an int() error naming neither the list
    nor the part."""
    from fastpath._ranges import parse_ranges
    MAX_VALUES = 1 << 20            # fastpath._ranges.MAX_VALUES
    with pytest.raises(ValueError, match=r"'0-2000000' holds 2000001 values"):
        parse_ranges("0-2000000", "--z-fields field list")
    with pytest.raises(ValueError, match="more than"):
        parse_ranges(",".join(["1"] * (MAX_VALUES + 1)))
    for bad in ("1,²", "²-3", "0-٣"):
        with pytest.raises(ValueError, match=r"cpulist .*is not a non-negative integer"):
            parse_ranges(bad, "cpulist")
    assert parse_ranges("0-1048575") == list(range(MAX_VALUES))
