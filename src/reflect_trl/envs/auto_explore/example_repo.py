"""A small synthetic repository (a coffee-shop backend, after the paper's "Coffee Company" repo).

``write_example_repo(dest)`` writes it to disk: a few dozen lines of Python, Markdown, reST, YAML, CSV and
shell spread over depths 0-3, plus entries the corpus filter must drop (tests, hidden and private files).
Tests and quick demos use it as an offline corpus that builds in milliseconds:
``AutoExploreEnv(roots=[str(write_example_repo(tmp_dir))])``.
"""

from __future__ import annotations

import os
from pathlib import Path

FILES: dict[str, str] = {
    "README.md": (
        "# Coffee Shop Backend\n\nA small service that takes coffee orders.\n\n"
        "## Installation steps\n\nRun `scripts/deploy.sh` on a fresh server.\n\n"
        "## Running the server locally\n\nStart it with `python -m coffee.server`.\n"
    ),
    "docs/api.md": (
        "# API reference\n\n## Order endpoints\n\nPOST /orders creates an order.\n\n"
        "## Menu endpoints\n\nGET /menu lists the drinks.\n"
    ),
    "docs/deployment.rst": (
        "Deployment guide\n================\n\nHow to put the shop online.\n\n"
        "Rolling back a release\n----------------------\n\nUse the previous image tag.\n"
    ),
    "coffee/menu.py": (
        '"""The drinks on offer."""\n\nPRICE_TABLE = {"espresso": 2.0, "latte": 3.5}\n\n\n'
        "class Menu:\n"
        '    """Holds the drinks offered by the shop and their prices."""\n\n'
        "    def list_drinks(self):\n        return sorted(PRICE_TABLE)\n\n\n"
        "def price_of(drink):\n"
        '    """Look up the price of one drink in euros."""\n'
        "    return PRICE_TABLE[drink]\n"
    ),
    "coffee/orders.py": (
        '"""Customer orders."""\n\n\nclass OrderQueue:\n'
        '    """Keeps pending customer orders in the order they arrived."""\n\n'
        "    def __init__(self):\n        self.items = []\n\n\n"
        "def place_order(queue, drink):\n"
        '    """Create an order for a drink and put it at the end of the queue."""\n'
        "    queue.items.append(drink)\n"
    ),
    "coffee/server.py": (
        '"""HTTP entry point."""\n\n\ndef start_server(port=8080):\n'
        '    """Start the web server that answers the API requests."""\n'
        "    return port\n"
    ),
    "coffee/payments/card.py": (
        '"""Card payments."""\n\n\ndef charge_card(card_number, amount):\n'
        '    """Charge the credit card of a customer for one order."""\n'
        "    return {'card': card_number[-4:], 'amount': amount}\n"
    ),
    "coffee/payments/refunds.py": (
        '"""Refunds."""\n\n\ndef issue_refund(order_id):\n'
        '    """Give the money of a cancelled order back to the customer."""\n'
        "    return order_id\n"
    ),
    "coffee/storage/db/schema.py": (
        '"""Database schema."""\n\n\nclass OrderTable:\n'
        '    """Describes the SQL table that stores every order."""\n\n'
        "    name = 'orders'\n"
    ),
    "coffee/storage/db/migrations.py": (
        '"""Schema migrations."""\n\n\ndef upgrade_schema(version):\n'
        '    """Bring the database schema up to the given version."""\n'
        "    return version\n"
    ),
    "coffee/storage/cache.py": (
        '"""In-memory cache."""\n\nCACHE_SECONDS = 30\n\n\ndef cached_menu():\n'
        '    """Return the menu kept in memory for a short while."""\n'
        "    return None\n"
    ),
    "config/settings.yaml": "port: 8080\ncurrency: EUR\nshop_name: Bean There\nopening_hour: 7\n",
    "scripts/deploy.sh": "#!/bin/sh\nset -e\necho 'deploying the coffee shop backend'\n",
    "data/beans.csv": "origin,roast,price\nEthiopia,light,12\nBrazil,medium,10\nSumatra,dark,11\n",
    # Dropped by the corpus filter:
    "tests/test_menu.py": "def test_menu():\n    assert True  # tests are not part of the corpus\n",
    ".env": "SECRET_TOKEN=do-not-show-this-anywhere\n",
    "coffee/_private_helpers.py": "def _hidden():\n    return 'private modules are not part of the corpus'\n",
    "coffee/__init__.py": '"""The coffee package (init files are left out by default)."""\n',
    "build/generated.py": "GENERATED_CODE = 'build outputs are not part of the corpus'\n",
    "notes.txt": "short",
    "logo.png": "not an allowed suffix, even though this is text",
}


def write_example_repo(dest: str | os.PathLike[str], name: str = "coffee_shop") -> Path:
    """Write the example repository to ``dest/name`` (overwriting its files) and return that path."""
    root = Path(dest) / name
    for rel, text in FILES.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root
