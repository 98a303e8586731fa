"""The 16 retail agent tools, written from TOOLS.md section 3 (checks in its order, its messages).

Each tool is a function of the DB and its arguments: it mutates the DB in place and returns the
result, a dict (a canonical record) or a plain string (`render` gives what the agent reads). The
catalogue (`catalogue.TOOLS`, `catalogue.call_tool`) names them and checks their arguments. A
failed call raises `ToolError` whose message is exactly what TOOLS.md quotes; the agent sees it
as `Error: <message>` (`error_text`). Apart from the one partial gift-card credit TOOLS.md 3.2
describes, a failed call leaves the DB untouched: every check runs before the first change.

Arithmetic is IEEE-754 double arithmetic in the order TOOLS.md states, `round2` is Python's
`round(x, 2)`, and amounts TOOLS.md stores unrounded stay unrounded, because the DB hash sees
every digit.
"""

from __future__ import annotations

import ast
import json
import operator
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from bench.tau2_retail.db import Db

Result = dict[str, Any] | str

CANCEL_REASONS = ("no longer needed", "ordered by mistake")
CALCULATOR_CHARACTERS = frozenset("0123456789+-*/(). ")
# Past this many bits an integer power could take the server's CPU for minutes (`9**9**9`);
# refused with the message the float conversion would eventually give anyway.
MAX_POWER_BITS = 1_000_000


class ToolError(Exception):
    """A failed tool call; `str(error)` is the message the agent sees after `Error: `."""


def error_text(error: ToolError) -> str:
    return f"Error: {error}"


def render(result: Result) -> str:
    """What the agent reads: plain strings as they are, records as JSON text."""
    return result if isinstance(result, str) else json.dumps(result)


def round2(value: float) -> float:
    return round(value, 2)


# -- shared look-ups (TOOLS.md section 2) ---------------------------------------------------


def _order(db: Db, order_id: str) -> dict[str, Any]:
    order: dict[str, Any] | None = db["orders"].get(order_id)
    if order is None:
        raise ToolError("Order not found")
    return order


def _user(db: Db, user_id: str) -> dict[str, Any]:
    user: dict[str, Any] | None = db["users"].get(user_id)
    if user is None:
        raise ToolError("User not found")
    return user


def _product(db: Db, product_id: str) -> dict[str, Any]:
    product: dict[str, Any] | None = db["products"].get(product_id)
    if product is None:
        raise ToolError("Product not found")
    return product


def _variant(db: Db, product_id: str, item_id: str) -> dict[str, Any]:
    variant: dict[str, Any] | None = _product(db, product_id)["variants"].get(item_id)
    if variant is None:
        raise ToolError("Variant not found")
    return variant


def _payment_method(db: Db, user_id: str, payment_method_id: str) -> dict[str, Any]:
    method: dict[str, Any] | None = _user(db, user_id)["payment_methods"].get(payment_method_id)
    if method is None:
        raise ToolError("Payment method not found")
    return method


def _is_gift_card(method: Mapping[str, Any]) -> bool:
    return bool(method["source"] == "gift_card")


def _first_missing_item(order: Mapping[str, Any], item_ids: Sequence[str]) -> str | None:
    """The multiset check: the first requested id asked for more often than the order has it."""
    on_order = Counter(line["item_id"] for line in order["items"])
    requested = Counter(item_ids)
    for item_id in item_ids:
        if requested[item_id] > on_order[item_id]:
            return item_id
    return None


def _first_line(order: Mapping[str, Any], item_id: str) -> dict[str, Any]:
    line: dict[str, Any] = next(line for line in order["items"] if line["item_id"] == item_id)
    return line


def _address(address1: str, address2: str, city: str, state: str, country: str, zip: str) -> dict[str, str]:
    return {"address1": address1, "address2": address2, "city": city, "country": country, "state": state, "zip": zip}


# -- the tools (TOOLS.md section 3) ---------------------------------------------------------


def calculate(db: Db, expression: str) -> Result:
    if not all(char in CALCULATOR_CHARACTERS for char in expression):
        raise ToolError("Invalid characters in expression")
    try:
        value = _evaluate(expression)
        return str(round2(float(value)))
    except (ArithmeticError, TypeError, ValueError, SyntaxError, RecursionError, MemoryError) as exc:
        raise ToolError(str(exc)) from exc


def cancel_pending_order(db: Db, order_id: str, reason: str) -> Result:
    order = _order(db, order_id)
    if order["status"] != "pending":
        raise ToolError("Non-pending order cannot be cancelled")
    if reason not in CANCEL_REASONS:
        raise ToolError("Invalid reason")
    refunds = []
    for entry in list(order["payment_history"]):
        refund = {
            "transaction_type": "refund",
            "amount": entry["amount"],
            "payment_method_id": entry["payment_method_id"],
        }
        # A missing method raises here, after earlier gift-card credits: TOOLS.md 3.2 keeps them.
        method = _payment_method(db, order["user_id"], entry["payment_method_id"])
        if _is_gift_card(method):
            method["balance"] = round2(method["balance"] + refund["amount"])
        refunds.append(refund)
    order["status"] = "cancelled"
    order["cancel_reason"] = reason
    order["payment_history"].extend(refunds)
    return order


def exchange_delivered_order_items(
    db: Db, order_id: str, item_ids: list[str], new_item_ids: list[str], payment_method_id: str
) -> Result:
    order = _order(db, order_id)
    if order["status"] != "delivered":
        raise ToolError("Non-delivered order cannot be exchanged")
    missing = _first_missing_item(order, item_ids)
    if missing is not None:
        raise ToolError(f"Number of {missing} not found.")
    if len(item_ids) != len(new_item_ids):
        raise ToolError("The number of items to be exchanged should match.")
    # Starts as the integer 0: with two empty lists the stored difference is `0`, not `0.0`.
    diff: float = 0
    for old, new in zip(item_ids, new_item_ids, strict=True):
        line = _first_line(order, old)
        variant = _variant(db, line["product_id"], new)
        if not variant["available"]:
            raise ToolError(f"New item {new} not found or available")
        diff = diff + (variant["price"] - line["price"])
    diff = round2(diff)
    method = _payment_method(db, order["user_id"], payment_method_id)
    if _is_gift_card(method) and method["balance"] < diff:
        raise ToolError("Insufficient gift card balance to pay for the price difference")
    order["status"] = "exchange requested"
    order["exchange_items"] = sorted(item_ids)
    order["exchange_new_items"] = sorted(new_item_ids)
    order["exchange_payment_method_id"] = payment_method_id
    order["exchange_price_difference"] = diff
    return order


def find_user_id_by_name_zip(db: Db, first_name: str, last_name: str, zip: str) -> Result:
    first, last = first_name.lower(), last_name.lower()
    for user in db["users"].values():
        name = user["name"]
        if name["first_name"].lower() == first and name["last_name"].lower() == last and user["address"]["zip"] == zip:
            return str(user["user_id"])
    raise ToolError("User not found")


def find_user_id_by_email(db: Db, email: str) -> Result:
    wanted = email.lower()
    for user in db["users"].values():
        if user["email"].lower() == wanted:
            return str(user["user_id"])
    raise ToolError("User not found")


def get_order_details(db: Db, order_id: str) -> Result:
    return _order(db, order_id)


def get_product_details(db: Db, product_id: str) -> Result:
    return _product(db, product_id)


def get_item_details(db: Db, item_id: str) -> Result:
    for product in db["products"].values():
        variant: dict[str, Any] | None = product["variants"].get(item_id)
        if variant is not None:
            return variant
    raise ToolError("Item not found")


def get_user_details(db: Db, user_id: str) -> Result:
    return _user(db, user_id)


def list_all_product_types(db: Db) -> Result:
    return json.dumps({product["name"]: product["product_id"] for product in db["products"].values()}, sort_keys=True)


def modify_pending_order_address(
    db: Db, order_id: str, address1: str, address2: str, city: str, state: str, country: str, zip: str
) -> Result:
    order = _order(db, order_id)
    if "pending" not in order["status"]:
        raise ToolError("Non-pending order cannot be modified")
    order["address"] = _address(address1, address2, city, state, country, zip)
    return order


def modify_pending_order_items(
    db: Db, order_id: str, item_ids: list[str], new_item_ids: list[str], payment_method_id: str
) -> Result:
    order = _order(db, order_id)
    if order["status"] != "pending":
        raise ToolError("Non-pending order cannot be modified")
    missing = _first_missing_item(order, item_ids)
    if missing is not None:
        raise ToolError(f"{missing} not found")
    if len(item_ids) != len(new_item_ids):
        raise ToolError("The number of items to be exchanged should match")
    diff: float = 0
    last_variant: dict[str, Any] | None = None
    for old, new in zip(item_ids, new_item_ids, strict=True):
        if old == new:
            raise ToolError("The new item id should be different from the old item id")
        line = _first_line(order, old)
        variant = _variant(db, line["product_id"], new)
        if not variant["available"]:
            raise ToolError(f"New item {new} not found or available")
        diff = diff + (variant["price"] - line["price"])
        last_variant = variant
    method = _payment_method(db, order["user_id"], payment_method_id)
    if _is_gift_card(method) and method["balance"] < diff:
        raise ToolError("Insufficient gift card balance to pay for the new item")
    # Unrounded on purpose (TOOLS.md 3.12): the stored amount keeps every digit of the sum.
    order["payment_history"].append(
        {
            "transaction_type": "payment" if diff > 0 else "refund",
            "amount": float(abs(diff)),
            "payment_method_id": payment_method_id,
        }
    )
    if _is_gift_card(method):
        method["balance"] = round2(method["balance"] - diff)
    for old, new in zip(item_ids, new_item_ids, strict=True):
        assert last_variant is not None  # the loop above ran for this pair
        line = _first_line(order, old)
        line["item_id"] = new
        # The quirk TOOLS.md 3.12 requires: every switched line gets the LAST pair's variant.
        line["price"] = last_variant["price"]
        line["options"] = dict(last_variant["options"])
    order["status"] = "pending (item modified)"
    return order


def modify_pending_order_payment(db: Db, order_id: str, payment_method_id: str) -> Result:
    order = _order(db, order_id)
    if "pending" not in order["status"]:
        raise ToolError("Non-pending order cannot be modified")
    method = _payment_method(db, order["user_id"], payment_method_id)
    history = order["payment_history"]
    if len(history) != 1 or history[0]["transaction_type"] != "payment":
        raise ToolError("There should be exactly one payment for a pending order")
    old_id = history[0]["payment_method_id"]
    if old_id == payment_method_id:
        raise ToolError("The new payment method should be different from the current one")
    amount = history[0]["amount"]
    if _is_gift_card(method) and method["balance"] < amount:
        raise ToolError("Insufficient gift card balance to pay for the order")
    history.append({"transaction_type": "payment", "amount": amount, "payment_method_id": payment_method_id})
    history.append({"transaction_type": "refund", "amount": amount, "payment_method_id": old_id})
    if _is_gift_card(method):
        method["balance"] = round2(method["balance"] - amount)
    old_method = db["users"][order["user_id"]]["payment_methods"].get(old_id)
    if old_method is not None and _is_gift_card(old_method):
        old_method["balance"] = round2(old_method["balance"] + amount)
    return order


def modify_user_address(
    db: Db, user_id: str, address1: str, address2: str, city: str, state: str, country: str, zip: str
) -> Result:
    user = _user(db, user_id)
    user["address"] = _address(address1, address2, city, state, country, zip)
    return user


def return_delivered_order_items(db: Db, order_id: str, item_ids: list[str], payment_method_id: str) -> Result:
    order = _order(db, order_id)
    if order["status"] != "delivered":
        raise ToolError("Non-delivered order cannot be returned")
    method = _payment_method(db, order["user_id"], payment_method_id)
    if not _is_gift_card(method) and payment_method_id != order["payment_history"][0]["payment_method_id"]:
        raise ToolError("Payment method should be the original payment method")
    if _first_missing_item(order, item_ids) is not None:
        raise ToolError("Some item not found")
    order["status"] = "return requested"
    order["return_items"] = sorted(item_ids)
    order["return_payment_method_id"] = payment_method_id
    return order


def transfer_to_human_agents(db: Db, summary: str) -> Result:
    return "Transfer successful"


# -- the calculator's evaluator --------------------------------------------------------------

_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}


def _evaluate(expression: str) -> Any:
    """What `eval(expression)` with no names gives, without letting `9**9**9` hang the server.

    The allowed characters only spell constants, `()`, `...`, unary +/- and the six binary
    operators, so applying Python's own operators to the parsed tree gives eval's values and
    eval's exception messages (eval, too, ignores leading spaces).
    """
    tree = ast.parse(expression.lstrip(" "), "<string>", "eval")
    return _node(tree.body)


def _node(node: ast.expr) -> Any:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Tuple):
        return tuple(_node(element) for element in node.elts)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_node(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _node(node.left), _node(node.right)
        if isinstance(node.op, ast.Pow) and _huge_power(left, right):
            raise OverflowError("int too large to convert to float")
        return _BINARY[type(node.op)](left, right)
    raise SyntaxError(f"unsupported expression: {ast.dump(node)}")


def _huge_power(base: Any, exponent: Any) -> bool:
    if not (isinstance(base, int) and isinstance(exponent, int)) or exponent <= 0 or abs(base) <= 1:
        return False
    return bool(abs(base).bit_length() * exponent > MAX_POWER_BITS)
