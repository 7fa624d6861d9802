"""Schemathesis hooks for the Skyport gateway (loaded by schemathesis.toml).

A request body can be valid by the schema and still be refused for a rule
JSON Schema cannot state: the deadline must be later than the pickup time,
and a callbackUrl whose host is a literal loopback, private, link-local,
multicast or unspecified address (which the configuration decides) is not
one callbacks may reach. Such a 422 is the server being right, so those
rejections are not failures of `positive_data_acceptance`; any other reason
for rejecting a schema-valid body still is.
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


@schemathesis.hook
def filter_failure(context, failure, case, response) -> bool:
    """Keeps every failure except a 422 whose only reasons are rules the schema cannot state."""
    if not isinstance(failure, RejectedPositiveData) or response.status_code != 422:
        return True
    try:
        errors = json.loads(response.content)["errors"]
        reasons = [(error["field"], error["message"]) for error in errors]
    except (ValueError, KeyError, TypeError):
        return True
    return not (reasons and all(expected(field, message) for field, message in reasons))
