"""What ``check_invariants()`` raises, and the rules it names.

Every manager, the Rust ones and the pure-Python twin, checks the same
bookkeeping rules in the same order and reports a broken one as
:class:`InvariantError` with the message ``"<rule>: <culprit>"``, the rule in
the words below (the Rust core's are in src/cache/state.rs;
tests/test_rust_python_pairs.py checks that both say the same).
"""

from __future__ import annotations

__all__ = ["POLICY_RULES", "RULES", "InvariantError"]


class InvariantError(AssertionError):
    """A manager's bookkeeping broke one of :data:`RULES`: a bug, never bad input.

    An ``AssertionError``, because no caller can provoke or handle it; it exists
    so tests, fuzzers and operators can ask a live manager whether it is sound.
    """


SLOTS_ACCOUNTED = "free + cached sizes equal cache_size"
FREEABLE_UNREFERENCED = "freeable holds exactly the unreferenced entries"
FREEABLE_SLOTS = "freeable slots equal free slots plus freeable sizes"
OCCURRENCES_MATCH = "every request's occurrence counts match its cached input ids"
REFERRERS_COUNTED = "no request id referenced by an entry that the request no longer counts"
COUNTED_REFERENCED = "every item a request counts is cached and referenced by it"
TIERS_ORDERED = "freeable lists the entries no waiting request needs before those one needs"
POLICY_ORDERED = "freeable follows the policy's order within each tier"
#: The bookkeeping rules, in the order they are checked.
RULES = (
    SLOTS_ACCOUNTED,
    FREEABLE_UNREFERENCED,
    FREEABLE_SLOTS,
    OCCURRENCES_MATCH,
    REFERRERS_COUNTED,
    COUNTED_REFERENCED,
)
#: The eviction-policy and lookahead rules, checked after :data:`RULES`.
#: Eviction *order* cannot be checked from a state alone beyond the policy's
#: structure; the differential tests compare it with the other implementation.
POLICY_RULES = (TIERS_ORDERED, POLICY_ORDERED)
