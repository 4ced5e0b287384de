"""fastpath.serve() and fastpath.connect() refuse a server name that is not a str.
"""

import pytest

import fastpath
from fastpath.errors import InputError


@pytest.mark.parametrize("name", [5, None, b"bytes", 1.5, ["x"]])
def test_serve_and_connect_refuse_a_name_that_is_not_a_str(name):
    # a non-str name met the typed attribute first: a bare "TypeError: Expected str, got int"
    # instead of the InputError that says what a name must be
    with pytest.raises(InputError, match="server name must be a non-empty str"):
        fastpath.serve(name)
    with pytest.raises(InputError, match="server name must be a non-empty str"):
        fastpath.connect(name, timeout=0)
