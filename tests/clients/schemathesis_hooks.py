"""Schemathesis hooks for the Skyport gateway (loaded by schemathesis.toml).

A request body can be valid by the schema and still be refused for a rule
JSON Schema cannot state: the deadline must be later than the pickup time.
Such a 422 is the server being right, so that one rejection is not a failure
of `positive_data_acceptance`; any other reason for rejecting a schema-valid
body still is.
"""

import json

import schemathesis
from schemathesis.openapi.checks import RejectedPositiveData

# The field errors the schema cannot express, as the gateway words them.
CROSS_FIELD_RULES = {("deadline", "must be later than pickupTime")}


@schemathesis.hook
def filter_failure(context, failure, case, response) -> bool:
    """Keeps every failure except a 422 whose only reasons are cross-field rules."""
    if not isinstance(failure, RejectedPositiveData) or response.status_code != 422:
        return True
    try:
        errors = json.loads(response.content)["errors"]
        reasons = {(error["field"], error["message"]) for error in errors}
    except (ValueError, KeyError, TypeError):
        return True
    return not (reasons and reasons <= CROSS_FIELD_RULES)
