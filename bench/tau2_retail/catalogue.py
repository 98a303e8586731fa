"""The catalogue of the 16 retail tools: name, kind, description and parameters of each, and the door.

`call_tool(db, name, arguments)` checks the arguments against the tool's parameters and runs the
tool (`tools`) on `db`, mutating it in place; a failed call raises `ToolError` with the message the
agent sees. `TOOLS` is what the MCP server lists and what the scorer replays.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal

from bench.tau2_retail.db import Db
from bench.tau2_retail.tools import (
    Result,
    ToolError,
    calculate,
    cancel_pending_order,
    exchange_delivered_order_items,
    find_user_id_by_email,
    find_user_id_by_name_zip,
    get_item_details,
    get_order_details,
    get_product_details,
    get_user_details,
    list_all_product_types,
    modify_pending_order_address,
    modify_pending_order_items,
    modify_pending_order_payment,
    modify_user_address,
    return_delivered_order_items,
    transfer_to_human_agents,
)

Kind = Literal["read", "write", "generic"]
ParamType = Literal["string", "array"]


@dataclass(frozen=True)
class ToolSpec:
    name: str
    kind: Kind
    description: str
    params: Mapping[str, tuple[ParamType, str]]
    function: Callable[..., Result]

    @property
    def mutating(self) -> bool:
        """Whether tau2 re-executes it when grading (the seven WRITE tools)."""
        return self.kind == "write"

    def input_schema(self) -> dict[str, Any]:
        properties: dict[str, Any] = {}
        for param, (kind, description) in self.params.items():
            if kind == "array":
                properties[param] = {"type": "array", "items": {"type": "string"}, "description": description}
            else:
                properties[param] = {"type": "string", "description": description}
        return {
            "type": "object",
            "properties": properties,
            "required": list(self.params),
            "additionalProperties": False,
        }


_ORDER_ID: tuple[ParamType, str] = ("string", "The order id, with its leading '#', e.g. '#W0000000'.")
_USER_ID: tuple[ParamType, str] = ("string", "The user id, e.g. 'sara_doe_496'.")
_PAYMENT: tuple[ParamType, str] = (
    "string",
    "A payment method id of the order's user, e.g. 'gift_card_0000000' or 'credit_card_0000000'.",
)
_ADDRESS: dict[str, tuple[ParamType, str]] = {
    "address1": ("string", "First address line, e.g. '123 Main St'."),
    "address2": ("string", "Second address line, e.g. 'Apt 1'; may be empty."),
    "city": ("string", "City, e.g. 'San Francisco'."),
    "state": ("string", "State, e.g. 'CA'."),
    "country": ("string", "Country, e.g. 'USA'."),
    "zip": ("string", "Zip code, e.g. '12345'."),
}


def _spec(function: Callable[..., Result], kind: Kind, description: str, **params: tuple[ParamType, str]) -> ToolSpec:
    return ToolSpec(function.__name__, kind, description, MappingProxyType(params), function)


TOOLS: Mapping[str, ToolSpec] = MappingProxyType(
    {
        spec.name: spec
        for spec in (
            _spec(
                calculate,
                "generic",
                "Evaluate an arithmetic expression made of digits, + - * / ( ) . and spaces; "
                "returns the value rounded to two decimals.",
                expression=("string", "The expression, e.g. '2 + 2' or '(10.5 - 3) * 2'."),
            ),
            _spec(
                cancel_pending_order,
                "write",
                "Cancel an order whose status is 'pending'. The reason must be 'no longer needed' or "
                "'ordered by mistake'. Every payment is refunded to its method; gift-card refunds are "
                "credited at once. List the details and get the user's explicit yes first.",
                order_id=_ORDER_ID,
                reason=("string", "'no longer needed' or 'ordered by mistake'."),
            ),
            _spec(
                exchange_delivered_order_items,
                "write",
                "Request an exchange of items of a delivered order for other available variants of the "
                "same products. The price difference is settled with the given payment method (a gift "
                "card needs enough balance). Can be done once per order; collect every item first and "
                "get the user's explicit yes.",
                order_id=_ORDER_ID,
                item_ids=("array", "Item ids on the order to exchange; repeat an id to exchange several lines of it."),
                new_item_ids=("array", "The new item ids, one per exchanged item, in the same order."),
                payment_method_id=_PAYMENT,
            ),
            _spec(
                find_user_id_by_name_zip,
                "read",
                "Find a user id by first name, last name and zip code (names match case-insensitively).",
                first_name=("string", "First name, e.g. 'John'."),
                last_name=("string", "Last name, e.g. 'Doe'."),
                zip=("string", "Zip code of the user's address, e.g. '12345'."),
            ),
            _spec(
                find_user_id_by_email,
                "read",
                "Find a user id by email address (matched case-insensitively).",
                email=("string", "Email address, e.g. 'john@example.com'."),
            ),
            _spec(
                get_order_details,
                "read",
                "Get an order: status, items, address, fulfillments and payment history.",
                order_id=_ORDER_ID,
            ),
            _spec(
                get_product_details,
                "read",
                "Get a product and all its variants (item ids, options, availability, prices).",
                product_id=("string", "The product id, e.g. '6086499569'; an item id is not a product id."),
            ),
            _spec(
                get_item_details,
                "read",
                "Get one variant by its item id: options, availability and price.",
                item_id=("string", "The item id, e.g. '1008292230'."),
            ),
            _spec(
                get_user_details,
                "read",
                "Get a user's profile: name, address, email, payment methods (with gift-card balances) and orders.",
                user_id=_USER_ID,
            ),
            _spec(
                list_all_product_types,
                "read",
                "List every product type as a JSON object mapping product name to product id.",
            ),
            _spec(
                modify_pending_order_address,
                "write",
                "Change the shipping address of a pending order. Get the user's explicit yes first.",
                order_id=_ORDER_ID,
                **_ADDRESS,
            ),
            _spec(
                modify_pending_order_items,
                "write",
                "Switch items of an order whose status is 'pending' to other available variants of the "
                "same products; the difference is charged or refunded with the given payment method. "
                "Can be done once per order; collect every item first and get the user's explicit yes.",
                order_id=_ORDER_ID,
                item_ids=("array", "Item ids on the order to modify; repeat an id to modify several lines of it."),
                new_item_ids=("array", "The new item ids, one per modified item, in the same order."),
                payment_method_id=_PAYMENT,
            ),
            _spec(
                modify_pending_order_payment,
                "write",
                "Pay a pending order with another of the user's payment methods; the old one is refunded. "
                "Get the user's explicit yes first.",
                order_id=_ORDER_ID,
                payment_method_id=_PAYMENT,
            ),
            _spec(
                modify_user_address,
                "write",
                "Change a user's default address (orders keep theirs). Get the user's explicit yes first.",
                user_id=_USER_ID,
                **_ADDRESS,
            ),
            _spec(
                return_delivered_order_items,
                "write",
                "Request a return of items of a delivered order; the refund goes to the original payment "
                "method or to a gift card of the user. Get the user's explicit yes first.",
                order_id=_ORDER_ID,
                item_ids=("array", "Item ids on the order to return; repeat an id to return several lines of it."),
                payment_method_id=_PAYMENT,
            ),
            _spec(
                transfer_to_human_agents,
                "generic",
                "Hand the user over to a human agent, with a summary of the issue. Only when the request "
                "cannot be handled with the other tools; this ends your part of the conversation.",
                summary=("string", "A summary of the user's issue."),
            ),
        )
    }
)


def _check_arguments(spec: ToolSpec, arguments: Mapping[str, Any]) -> None:
    missing = [param for param in spec.params if param not in arguments]
    extra = [param for param in arguments if param not in spec.params]
    if missing or extra:
        problems = [f"missing argument '{param}'" for param in missing]
        problems += [f"unexpected argument '{param}'" for param in extra]
        raise ToolError(f"{spec.name}: {'; '.join(problems)}")
    for param, (kind, _) in spec.params.items():
        value = arguments[param]
        if kind == "string" and not isinstance(value, str):
            raise ToolError(f"{spec.name}: argument '{param}' must be a string")
        if kind == "array" and not (isinstance(value, list) and all(isinstance(item, str) for item in value)):
            raise ToolError(f"{spec.name}: argument '{param}' must be an array of strings")


def call_tool(db: Db, name: str, arguments: Mapping[str, Any]) -> Result:
    """Run tool `name` on `db` (in place). Raises `ToolError` with the agent-visible message."""
    spec = TOOLS.get(name)
    if spec is None:
        raise ToolError(f"Tool '{name}' not found")
    _check_arguments(spec, arguments)
    return spec.function(db, **arguments)
