"""Schemathesis hooks for the Skyport gateway (loaded by schemathesis.toml).

A request body can be valid by the schema and still be refused for a rule
JSON Schema cannot state: the deadline must be later than the pickup time,
and a callbackUrl whose host is a literal loopback, private, link-local,
multicast or unspecified address (which the configuration decides) is not
one callbacks may reach; and a deliveryId of the gateway's own shapes
(starting "sp-", or "k-" and 32 hex digits, which a stateful run takes from
an earlier answer) is the gateway's, not a client's to choose, which the
schema says in words only. Such a 422 is the server being right, so those
rejections are not failures of `positive_data_acceptance`; any other reason
for rejecting a schema-valid body still is. Likewise a listing's `cursor`
is opaque: only one the API gave out is valid, which no schema can state,
so a 400 that says the cursor is not one of those is the server being right.
So is a 412 to a PATCH whose `If-Match` does not name the status's current
`ETag`: only a tag the API gave out can, which no schema can state either.

A batch answers each of its requests on its own: a request that violates
the schema gets its own 422 inside the batch's 200, so that 200 accepts
negative data only when such a request was answered 202.

And the other way: `pickupTime` and `deadline` are RFC 3339 date-times in the
schema (what the generated clients send), and milliseconds since the epoch
are accepted too, as their `x-also-accepts` says (the reference
implementation's clients send them). A body the server accepted with such a
number where the schema has a date-time is that documented leniency, not a
failure of `negative_data_rejection`: the server checks everything else.
"""

import json

import jsonschema
import schemathesis
from schemathesis.core.failures import AcceptedNegativeData
from schemathesis.openapi.checks import RejectedPositiveData

# The field errors the schema cannot express, as the gateway words them.
CROSS_FIELD_RULES = {("deadline", "must be later than pickupTime")}
# The address policy's refusals end so ("10.0.0.1 is private, which callbacks may not reach").
ADDRESS_POLICY = "which callbacks may not reach"
# The refusals of a deliveryId of the gateway's own shapes end so.
GATEWAYS_IDS = "the gateway names the deliveries of"


def expected(field: str, message: str) -> bool:
    """Whether a field error is one of the rules the schema cannot express."""
    return (
        (field, message) in CROSS_FIELD_RULES
        or (field == "callbackUrl" and message.endswith(ADDRESS_POLICY))
        or (field == "deliveryId" and GATEWAYS_IDS in message)
    )


# The 400 of a listing whose cursor the API never gave out, as the gateway words it.
FOREIGN_CURSOR = "cursor is not one this API gave out"


def foreign_cursor(response) -> bool:
    """Whether a 400 refuses only a cursor the API never gave out."""
    try:
        return json.loads(response.content)["detail"] == FOREIGN_CURSOR
    except (ValueError, KeyError, TypeError):
        return False


# The fields that also take milliseconds since the epoch (`x-also-accepts`).
ALSO_MILLISECONDS = ("pickupTime", "deadline")


def milliseconds_where_a_date_time_goes(case) -> bool:
    """Whether the body has milliseconds (a JSON number) for a time field."""
    return isinstance(case.body, dict) and milliseconds_where_a_date_time_goes_in(case.body)


def milliseconds_where_a_date_time_goes_in(body: dict) -> bool:
    """Whether a delivery request has milliseconds for a time field."""
    return any(
        isinstance(body.get(field), (int, float)) and not isinstance(body.get(field), bool)
        for field in ALSO_MILLISECONDS
    )


# The route of batches, whose requests are each answered on their own.
BATCH = "/api/deliveryrequests/batch"


def item_accepted_against_the_schema(case, response) -> bool:
    """Whether a batch answered 200 accepted (202) a request the schema
    refuses: a batch refuses a request that violates the schema in that
    request's own result (a 422), not by refusing the whole batch, so its
    200 is not the acceptance of negative data unless one such request was
    accepted. A request with milliseconds for a time field is the documented
    leniency, as it is in a POST of it alone."""
    requests = case.body.get("requests") if isinstance(case.body, dict) else None
    try:
        results = json.loads(response.content)["results"]
    except (ValueError, KeyError, TypeError):
        return True
    if not isinstance(requests, list) or len(results) != len(requests):
        return True
    spec = case.operation.schema.raw_schema
    validator = jsonschema.Draft202012Validator(
        {"$ref": "#/components/schemas/DeliveryRequest", "components": spec["components"]}
    )
    return any(
        result.get("status") == 202
        and not validator.is_valid(request)
        and not (isinstance(request, dict) and milliseconds_where_a_date_time_goes_in(request))
        for request, result in zip(requests, results)
    )


@schemathesis.hook
def filter_failure(context, failure, case, response) -> bool:
    """Keeps every failure except a 422 whose only reasons are rules the schema
    cannot state, a 400 refusing a cursor the API never gave out, a 412 to an
    If-Match the API never gave out, and a body accepted with milliseconds for
    a time field."""
    if isinstance(failure, AcceptedNegativeData):
        if case.path == BATCH and response.status_code == 200:
            return item_accepted_against_the_schema(case, response)
        return not milliseconds_where_a_date_time_goes(case)
    if not isinstance(failure, RejectedPositiveData):
        return True
    if response.status_code == 400:
        return not foreign_cursor(response)
    if response.status_code == 412:
        return "If-Match" not in (case.headers or {})
    if response.status_code != 422:
        return True
    try:
        errors = json.loads(response.content)["errors"]
        reasons = [(error["field"], error["message"]) for error in errors]
    except (ValueError, KeyError, TypeError):
        return True
    return not (reasons and all(expected(field, message) for field, message in reasons))
