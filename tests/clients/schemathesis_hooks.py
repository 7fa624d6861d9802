"""Schemathesis hooks for the Skyport gateway (loaded by schemathesis.toml).

A request body can be valid by the schema and still be refused for a rule
JSON Schema cannot state: the deadline must be later than the pickup time,
and a callbackUrl whose host is a literal loopback, private, link-local,
multicast or unspecified address (which the configuration decides) is not
one callbacks may reach. Such a 422 is the server being right, so those
rejections are not failures of `positive_data_acceptance`; any other reason
for rejecting a schema-valid body still is. Likewise a listing's `cursor`
is opaque: only one the API gave out is valid, which no schema can state,
so a 400 that says the cursor is not one of those is the server being right.
"""

import json

import schemathesis
from schemathesis.openapi.checks import RejectedPositiveData

# The field errors the schema cannot express, as the gateway words them.
CROSS_FIELD_RULES = {("deadline", "must be later than pickupTime")}
# The address policy's refusals end so ("10.0.0.1 is private, which callbacks may not reach").
ADDRESS_POLICY = "which callbacks may not reach"


def expected(field: str, message: str) -> bool:
    """Whether a field error is one of the rules the schema cannot express."""
    return (field, message) in CROSS_FIELD_RULES or (
        field == "callbackUrl" and message.endswith(ADDRESS_POLICY)
    )


# The 400 of a listing whose cursor the API never gave out, as the gateway words it.
FOREIGN_CURSOR = "cursor is not one this API gave out"


def foreign_cursor(response) -> bool:
    """Whether a 400 refuses only a cursor the API never gave out."""
    try:
        return json.loads(response.content)["detail"] == FOREIGN_CURSOR
    except (ValueError, KeyError, TypeError):
        return False


@schemathesis.hook
def filter_failure(context, failure, case, response) -> bool:
    """Keeps every failure except a 422 whose only reasons are rules the schema
    cannot state, and a 400 refusing a cursor the API never gave out."""
    if not isinstance(failure, RejectedPositiveData):
        return True
    if response.status_code == 400:
        return not foreign_cursor(response)
    if response.status_code != 422:
        return True
    try:
        errors = json.loads(response.content)["errors"]
        reasons = [(error["field"], error["message"]) for error in errors]
    except (ValueError, KeyError, TypeError):
        return True
    return not (reasons and all(expected(field, message) for field, message in reasons))
