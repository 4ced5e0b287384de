"""Test helpers: oracles, builders and stand-ins shared by the feature tests. Test files import
from here, never from each other."""
