"""Regenerate the ``examples/shop`` example: a bookshop database and its SLayer store, written by SLayer.

    python examples/make_example.py [--slayer-venv PATH] [--keep-db]

Steps:

1. ``shop/data/shop.db``: a small bookshop SQLite database built from a fixed seed (5 tables, a
   few hundred rows). ``--keep-db`` reuses the committed file instead.
2. Twice, once per backend (``shop/store/`` YAML and ``shop/store.db`` SQLite), the same sequence
   against motley-slayer 1.4.1 in its own venv (see ``bench/_slayer_env.py``): the CLI's
   ``datasources create``, ``ingest``, ``search refresh-samples``; storage-API edits (descriptions,
   labels, formats, a hidden column, a named measure, a custom aggregation, a default time
   dimension, the datasource priority); then 11 ``memory save`` calls through the CLI.
3. Memory ``created_at`` stamps are rewritten (through the storage API) to fixed times in save
   order, so a rerun changes no byte of the committed stores.
4. Both stores are checked: SLayer loads the same documents from each, and so does our
   ``load_catalog``, with no issues.

The datasource's connection string is ``sqlite:///${SLAYER_EXAMPLE_DIR}/shop.db``; SLayer expands the
placeholder when it connects, so no path of the build machine lands in the files. Set
``SLAYER_EXAMPLE_DIR=<repo>/examples/shop/data`` to point SLayer itself at the store.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from datetime import date, timedelta
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO / "bench"))
import _slayer_env as senv  # noqa: E402

SHOP = HERE / "shop"
DATA_DIR = SHOP / "data"
PLACEHOLDER = "SLAYER_EXAMPLE_DIR"
CONNECTION = "sqlite:///${" + PLACEHOLDER + "}/shop.db"  # a literal ${...}: SLayer expands it at use time
SEED = 1042
FIRST_MEMORY_AT = "2026-01-15T09:00:00Z"

# --------------------------------------------------------------------------- the database

_SCHEMA = """
CREATE TABLE authors (
    author_id INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    country TEXT,
    born_year INTEGER
);
CREATE TABLE books (
    sku TEXT PRIMARY KEY,
    title TEXT NOT NULL,
    author_id INTEGER NOT NULL REFERENCES authors(author_id),
    genre TEXT NOT NULL,
    format TEXT NOT NULL,
    list_price REAL NOT NULL,
    published_on DATE
);
CREATE TABLE customers (
    customer_id INTEGER PRIMARY KEY,
    full_name TEXT NOT NULL,
    email TEXT,
    city TEXT,
    joined_on DATE NOT NULL,
    is_member BOOLEAN NOT NULL
);
CREATE TABLE orders (
    order_id INTEGER PRIMARY KEY,
    customer_id INTEGER NOT NULL REFERENCES customers(customer_id),
    ordered_at DATE NOT NULL,
    channel TEXT NOT NULL,
    status TEXT NOT NULL,
    shipping_fee REAL NOT NULL
);
CREATE TABLE order_lines (
    line_id INTEGER PRIMARY KEY,
    order_id INTEGER NOT NULL REFERENCES orders(order_id),
    sku TEXT NOT NULL REFERENCES books(sku),
    quantity INTEGER NOT NULL,
    unit_price REAL NOT NULL,
    discount REAL NOT NULL,
    line_total REAL NOT NULL
);
"""

_FIRST = [
    "Ada",
    "Bruno",
    "Chiara",
    "Dmitri",
    "Elena",
    "Farid",
    "Greta",
    "Hugo",
    "Ines",
    "Jonas",
    "Kaori",
    "Luis",
    "Maren",
    "Nadia",
    "Oskar",
    "Priya",
    "Quentin",
    "Rosa",
    "Sven",
    "Tomasz",
    "Uma",
    "Vera",
]
_LAST = [
    "Almeida",
    "Berg",
    "Costa",
    "Dubois",
    "Eriksen",
    "Fischer",
    "García",
    "Haddad",
    "Ivanova",
    "Jansen",
    "Kowalski",
    "Lindqvist",
    "Moreau",
    "Novak",
    "Okafor",
    "Petrov",
    "Rossi",
    "Silva",
    "Tanaka",
    "Weber",
]
_COUNTRIES = ["GB", "US", "FR", "DE", "JP", "BR", "NG", "SE", "IT", "PL"]
_CITIES = [
    "London",
    "Leeds",
    "Bristol",
    "Manchester",
    "Edinburgh",
    "Cardiff",
    "York",
    "Brighton",
    "Oxford",
    "Belfast",
]
_GENRES = ["fiction", "mystery", "science", "history", "children", "poetry", "travel", "cookery"]
_FORMATS = ["hardcover", "paperback", "ebook"]
_ADJ = ["Silent", "Golden", "Hidden", "Last", "Northern", "Paper", "Quiet", "Restless", "Salt", "Winter"]
_NOUN = [
    "Harbour",
    "Orchard",
    "Atlas",
    "Lantern",
    "Garden",
    "River",
    "Archive",
    "Compass",
    "Kitchen",
    "Island",
]


def build_database(path: Path, seed: int = SEED) -> dict[str, int]:
    """Write the bookshop database deterministically (same seed, same bytes); return row counts."""
    rng = random.Random(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    conn = sqlite3.connect(path)
    conn.executescript(_SCHEMA)

    authors = []
    for i in range(1, 25):
        authors.append(
            (i, f"{rng.choice(_FIRST)} {rng.choice(_LAST)}", rng.choice(_COUNTRIES), rng.randint(1930, 1995))
        )
    books = []
    titles: set[str] = set()
    for i in range(60):
        title = f"The {rng.choice(_ADJ)} {rng.choice(_NOUN)}"
        while title in titles:
            title = f"{title} II"
        titles.add(title)
        fmt = rng.choice(_FORMATS)
        base = {"hardcover": 24.0, "paperback": 11.0, "ebook": 6.0}[fmt]
        price = round(base + rng.randint(0, 16) - 0.01, 2)
        published = date(2005, 1, 1) + timedelta(days=rng.randint(0, 19 * 365))
        books.append(
            (
                f"SKU-{1001 + i}",
                title,
                rng.randint(1, len(authors)),
                rng.choice(_GENRES),
                fmt,
                price,
                published.isoformat(),
            )
        )
    price_of = {b[0]: b[5] for b in books}
    customers = []
    for i in range(1, 81):
        first, last = rng.choice(_FIRST), rng.choice(_LAST)
        email = f"{first.lower()}.{i}@example.org" if rng.random() < 0.85 else None
        joined = date(2022, 1, 1) + timedelta(days=rng.randint(0, 900))
        customers.append(
            (i, f"{first} {last}", email, rng.choice(_CITIES), joined.isoformat(), int(rng.random() < 0.35))
        )
    member = {c[0]: c[5] for c in customers}
    orders, lines = [], []
    for i in range(1, 201):
        cust = rng.randint(1, len(customers))
        ordered = date(2024, 1, 1) + timedelta(days=rng.randint(0, 365))
        channel = rng.choices(["web", "store", "app"], weights=[5, 3, 2])[0]
        status = rng.choices(["paid", "shipped", "refunded", "cancelled"], weights=[6, 10, 1, 1])[0]
        fee = 0.0 if channel == "store" else rng.choice([2.99, 3.99, 4.99])
        orders.append((i, cust, ordered.isoformat(), channel, status, fee))
        skus = rng.sample(sorted(price_of), k=rng.choice([1, 1, 2, 2, 3, 4]))
        if ordered.month == 3 and "SKU-1042" not in skus and rng.random() < 0.4:
            skus.append("SKU-1042")
        for sku in skus:
            qty = rng.choices([1, 2, 3, 5], weights=[12, 5, 2, 1])[0]
            unit = price_of[sku]
            if sku == "SKU-1042" and ordered.month == 3:
                unit = 4.99  # the mispricing a memory explains
            disc = 0.1 if member[cust] else (0.05 if rng.random() < 0.1 else 0.0)
            lines.append((len(lines) + 1, i, sku, qty, unit, disc, round(qty * unit * (1 - disc), 2)))
    conn.executemany("INSERT INTO authors VALUES (?,?,?,?)", authors)
    conn.executemany("INSERT INTO books VALUES (?,?,?,?,?,?,?)", books)
    conn.executemany("INSERT INTO customers VALUES (?,?,?,?,?,?)", customers)
    conn.executemany("INSERT INTO orders VALUES (?,?,?,?,?,?)", orders)
    conn.executemany("INSERT INTO order_lines VALUES (?,?,?,?,?,?,?)", lines)
    conn.commit()
    conn.execute("VACUUM")
    conn.close()
    return {
        "authors": len(authors),
        "books": len(books),
        "customers": len(customers),
        "orders": len(orders),
        "order_lines": len(lines),
    }


# --------------------------------------------------------------------------- the SLayer store

DATASOURCE_DESCRIPTION = "Bookshop sales: catalogue, customers, orders and order lines (example data)"

# Applied through SLayer's storage API (get_model -> edit -> save_model, validated).
EDITS = {
    "authors": {
        "description": "One row per author in the catalogue",
        "columns": {
            "name": {"description": "Author's full name as printed on the cover"},
            "country": {"description": "ISO country code of the author's nationality"},
            "born_year": {"label": "Year of birth"},
        },
    },
    "books": {
        "description": "One row per sellable title and format (the catalogue); keyed by SKU",
        "columns": {
            "sku": {"description": "Stock keeping unit, e.g. SKU-1042", "label": "SKU"},
            "genre": {"description": "Shelf genre used in the shop's reporting"},
            "format": {"description": "hardcover, paperback or ebook"},
            "list_price": {
                "description": "Current catalogue price in pounds",
                "label": "List price",
                "format": {"type": "currency", "precision": 2, "symbol": "£"},
            },
            "published_on": {"label": "Publication date"},
        },
    },
    "customers": {
        "description": "One row per registered customer",
        "columns": {
            "full_name": {"label": "Customer name"},
            "email": {"description": "Contact email; personal data", "hidden": True},
            "city": {"description": "Delivery city of the customer's default address"},
            "joined_on": {"label": "Joined"},
            "is_member": {
                "description": "True for loyalty-club members (10% off every line)",
                "label": "Member",
            },
        },
    },
    "orders": {
        "description": "One row per checkout, in any channel",
        "default_time_dimension": "ordered_at",
        "columns": {
            "ordered_at": {"description": "Business date of the checkout", "label": "Order date"},
            "channel": {"description": "Where the order was placed: web, store or app"},
            "status": {"description": "paid, shipped, refunded or cancelled"},
            "shipping_fee": {
                "description": "Delivery charge, once per order; 0 in store",
                "label": "Shipping fee",
                "format": {"type": "currency", "precision": 2, "symbol": "£"},
            },
        },
    },
    "order_lines": {
        "description": "One row per book on an order",
        "columns": {
            "quantity": {"description": "Copies of the book on this line"},
            "unit_price": {
                "description": "Price per copy charged on the day, before discount",
                "label": "Unit price",
                "format": {"type": "currency", "precision": 2, "symbol": "£"},
            },
            "discount": {
                "description": "Fraction taken off the line (members 0.10)",
                "format": {"type": "percent", "precision": 0},
            },
            "line_total": {
                "description": "quantity * unit_price * (1 - discount), in pounds",
                "label": "Line total",
                "format": {"type": "currency", "precision": 2, "symbol": "£"},
            },
        },
        "measures": [
            {
                "name": "revenue",
                "formula": "sum(line_total)",
                "label": "Revenue",
                "description": "Money taken on the lines, after discounts, before shipping",
            }
        ],
        "aggregations": [
            {
                "name": "weighted_avg",
                "formula": "SUM({value} * {weight}) / NULLIF(SUM({weight}), 0)",
                "params": [{"name": "weight", "sql": "quantity"}],
                "description": "Average of a column weighted by another (default: quantity)",
            }
        ],
    },
}

# (learning, entities, extra CLI flags). Ids are allocated 1.. in this order unless --id is given.
MEMORIES: list[tuple[str, str | None, list[str]]] = [
    (
        "order_lines.line_total already has the discount applied; never subtract the discount again when "
        "computing revenue.",
        "shop.order_lines.line_total,shop.order_lines.discount",
        [],
    ),
    (
        "Revenue excludes refunded and cancelled orders: keep orders.status in ('paid', 'shipped').",
        "shop.orders.status,shop.order_lines.revenue",
        ["--description", "Revenue counts paid and shipped orders only"],
    ),
    (
        "SKU-1042 was mispriced at 4.99 during March 2024. Leave its March lines out when analysing prices "
        "or discounts.",
        "shop.books.sku,shop.order_lines.unit_price",
        [],
    ),
    (
        "Customer emails are personal data and hidden from analysis; count customers by customer_id.",
        "shop.customers.email,shop.customers",
        ["--description", "Do not use customer emails"],
    ),
    (
        "Shipping fees are charged once per order. Sum shipping_fee over orders, never over order lines, or "
        "it is counted once per book.\n\nIn-store orders never pay shipping.",
        "shop.orders.shipping_fee,shop.order_lines",
        [],
    ),
    (
        "Loyalty-club members get 10% off every line; the discount column records it, so member revenue is "
        "already net.",
        "shop.customers.is_member,shop.order_lines.discount",
        [],
    ),
    (
        "For the average selling price use weighted_avg(unit_price) (weighted by quantity), not a plain avg.",
        "shop.order_lines.weighted_avg,shop.order_lines.unit_price",
        [],
    ),
    (
        "The app channel launched on 2024-06-01; earlier orders with channel = 'app' are test traffic.",
        "shop.orders.channel,shop.orders.ordered_at",
        ["--description", "App orders before June 2024 are tests"],
    ),
    (
        "Paid revenue by genre",
        None,
        [
            "--description",
            "Example query: revenue of paid orders per book genre",
            "--query",
            json.dumps(
                {
                    "source_model": "order_lines",
                    "measures": [{"formula": "sum(line_total)", "name": "revenue"}],
                    "dimensions": ["books.genre"],
                    "filters": ["orders.status = 'paid'"],
                }
            ),
        ],
    ),
    (
        "The shop database is a nightly copy of the till system, so today's orders appear tomorrow.",
        "shop",
        ["--description", "Data lags one day"],
    ),
    (
        "How we define revenue: line totals after discount, paid and shipped orders only, without shipping. "
        "See memory 1 and memory 2.",
        "memory:1,memory:2,shop.order_lines.revenue",
        ["--id", "kb.revenue", "--description", "Revenue definition"],
    ),
]

# Runs in the SLayer venv; argv: storage path, edits JSON, first created_at.
_API_EDITS = r"""
import asyncio, json, sys
from datetime import datetime, timedelta
from slayer.storage.base import resolve_storage
from slayer.core.models import Aggregation, ModelMeasure
from slayer.core.format import NumberFormat

async def main(path, edits):
    st = resolve_storage(path)
    done = []
    for name, edit in edits.items():
        model = await st.get_model(name, data_source="shop")
        if model is None:
            raise SystemExit(f"model shop.{name} was not ingested")
        updates = {k: edit[k] for k in ("description", "default_time_dimension") if k in edit}
        columns = []
        for col in model.columns:
            change = dict(edit.get("columns", {}).get(col.name, {}))
            if "format" in change:
                change["format"] = NumberFormat(**change["format"])
            columns.append(col.model_copy(update=change) if change else col)
        missing = set(edit.get("columns", {})) - {c.name for c in model.columns}
        if missing:
            raise SystemExit(f"shop.{name} has no column(s) {sorted(missing)}")
        updates["columns"] = columns
        if "measures" in edit:
            updates["measures"] = list(model.measures) + [ModelMeasure(**m) for m in edit["measures"]]
        if "aggregations" in edit:
            updates["aggregations"] = list(model.aggregations) + [Aggregation(**a) for a in edit["aggregations"]]
        edited = type(model).model_validate({**model.model_dump(), **{k: v for k, v in updates.items()}})
        await st.save_model(edited)
        done.append(name)
    await st.set_datasource_priority(["shop"])
    return done

async def stamp(path, first):
    st = resolve_storage(path)
    mems = sorted(await st.list_memories(), key=lambda m: m.created_at)
    t0 = datetime.fromisoformat(first.replace("Z", "+00:00"))
    for i, m in enumerate(mems):
        await st._save_memory_row(m.model_copy(update={"created_at": t0 + timedelta(minutes=i)}))
    return [m.id for m in mems]

path, what = sys.argv[1], sys.argv[2]
if what == "edit":
    print(json.dumps({"edited": asyncio.run(main(path, json.loads(sys.argv[3])))}))
else:
    print(json.dumps({"stamped": asyncio.run(stamp(path, sys.argv[3]))}))
"""

# Runs in the SLayer venv; argv: storage path. Everything SLayer loads, in comparable form.
_SLAYER_DUMP = r"""
import asyncio, json, sys
from slayer.storage.base import resolve_storage

async def main(path):
    st = resolve_storage(path)
    models, bad_models = await st.load_models()
    mems, bad_mems = await st.load_memories()
    names = await st.list_datasources()
    dss = {n: (await st.get_datasource(n)).model_dump(mode="json", exclude_none=True) for n in names}
    return {"datasources": dss, "priority": await st.get_datasource_priority(),
            "models": {f"{m.data_source}.{m.name}": m.model_dump(mode="json", exclude_none=True) for m in models},
            "memories": {m.id: m.model_dump(mode="json") for m in mems},
            "failed": [str(e) for e in bad_models + bad_mems]}

print(json.dumps(asyncio.run(main(sys.argv[1]))))
"""


def _cli(python: Path, home: str, *args: str) -> str:
    """One ``slayer`` CLI call in the oracle venv; returns stdout, raises with stderr on failure."""
    env = senv.slayer_env(home, {PLACEHOLDER: str(DATA_DIR)})
    proc = subprocess.run([str(python), "-m", "slayer", *args], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise SystemExit(
            f"slayer {' '.join(args[:3])} ... failed (exit {proc.returncode}):\n"
            f"{proc.stdout[-1500:]}\n{proc.stderr[-3000:]}"
        )
    return proc.stdout


def build_store(storage: Path, python: Path, venv: str | None) -> None:
    """Run the whole SLayer sequence against one storage path (a directory or a ``.db``)."""
    st = str(storage)
    extra = {PLACEHOLDER: str(DATA_DIR)}
    with tempfile.TemporaryDirectory(prefix="slayer-home-") as home:
        _cli(
            python,
            home,
            "datasources",
            "--storage",
            st,
            "create",
            CONNECTION,
            "--name",
            "shop",
            "--description",
            DATASOURCE_DESCRIPTION,
            "-y",
        )
        _cli(python, home, "ingest", "--datasource", "shop", "--storage", st)
        _cli(python, home, "search", "refresh-samples", "--storage", st)
        senv.run_in_slayer(_API_EDITS, st, "edit", json.dumps(EDITS), env=extra, venv=venv)
        for learning, entities, flags in MEMORIES:
            args = ["memory", "--storage", st, "save", "--learning", learning, *flags]
            if entities is not None:
                args += ["--entities", entities]
            _cli(python, home, *args)
        senv.run_in_slayer(_API_EDITS, st, "stamp", FIRST_MEMORY_AT, env=extra, venv=venv)


def _publish(built: Path, dest: Path) -> None:
    """Replace ``dest`` with ``built``; files world-readable (SLayer writes them 0600)."""
    if dest.is_dir():
        shutil.rmtree(dest)
    elif dest.exists():
        dest.unlink()
    shutil.move(str(built), dest)
    paths = [dest] + (list(dest.rglob("*")) if dest.is_dir() else [])
    for p in paths:
        p.chmod(0o755 if p.is_dir() else 0o644)


def verify(yaml_store: Path, sqlite_store: Path, venv: str | None) -> list[str]:
    """Problems found comparing the two stores, through SLayer and through our reader."""
    problems: list[str] = []
    extra = {PLACEHOLDER: str(DATA_DIR)}
    a = senv.run_in_slayer(_SLAYER_DUMP, yaml_store, env=extra, venv=venv)
    b = senv.run_in_slayer(_SLAYER_DUMP, sqlite_store, env=extra, venv=venv)
    for key in ("datasources", "priority", "models", "memories"):
        if a[key] != b[key]:
            problems.append(f"SLayer loads different {key} from the YAML and SQLite stores")
    problems += [f"SLayer could not load: {f}" for f in a["failed"] + b["failed"]]

    sys.path.insert(0, str(REPO))
    from slayer_lsp.catalog import load_catalog

    cats = {"yaml": load_catalog(yaml_store), "sqlite": load_catalog(sqlite_store)}
    for name, cat in cats.items():
        problems += [f"{name}: {i}" for i in cat.issues]
        if cat.fatal:
            problems.append(f"{name}: {cat.fatal}")
    ours_y = {k: doc.value for k, doc in cats["yaml"].docs.items()}
    ours_s = {k: doc.value for k, doc in cats["sqlite"].docs.items()}
    if ours_y != ours_s:
        diff = sorted(
            f"{k.kind}:{k.name}" for k in ours_y.keys() | ours_s.keys() if ours_y.get(k) != ours_s.get(k)
        )
        problems.append(f"our reader sees different documents in the two stores: {diff}")
    if set(cats["yaml"].models) != set(a["models"]) or set(cats["yaml"].memories) != set(a["memories"]):
        problems.append("our reader and SLayer disagree on which models/memories exist")
    for text in _all_text(yaml_store):
        if str(REPO) in text or str(DATA_DIR) in text:
            problems.append("an absolute path of this machine leaked into the YAML store")
            break
    if str(DATA_DIR).encode() in sqlite_store.read_bytes():
        problems.append("an absolute path of this machine leaked into store.db")
    return problems


def _all_text(root: Path):
    for p in sorted(root.rglob("*")):
        if p.is_file() and p.suffix in (".yaml", ".md"):
            yield p.read_text(encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--keep-db", action="store_true", help="reuse examples/shop/data/shop.db as it is")
    senv.add_venv_option(ap)
    args = ap.parse_args(argv)
    python = senv.slayer_python(args.slayer_venv)

    db = DATA_DIR / "shop.db"
    if not (args.keep_db and db.is_file()):
        counts = build_database(db)
        print(f"wrote {db.relative_to(REPO)}: {counts}, {db.stat().st_size // 1024} KiB", file=sys.stderr)

    with tempfile.TemporaryDirectory(prefix="shop-build-") as tmp:
        built_yaml, built_db = Path(tmp) / "store", Path(tmp) / "store.db"
        for target in (built_yaml, built_db):
            print(f"building {target.name} with SLayer ...", file=sys.stderr)
            build_store(target, python, args.slayer_venv)
        problems = verify(built_yaml, built_db, args.slayer_venv)
        if problems:
            print("NOT published; problems:\n  " + "\n  ".join(problems), file=sys.stderr)
            return 1
        _publish(built_yaml, SHOP / "store")
        _publish(built_db, SHOP / "store.db")
    print(
        f"wrote {(SHOP / 'store').relative_to(REPO)}/ and {(SHOP / 'store.db').relative_to(REPO)}; "
        "both stores load the same documents with no issues",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
