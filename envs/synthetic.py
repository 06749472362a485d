"""Seeded synthetic pool in the EnvScaler format.

Each environment is a small stateful service with its own vocabulary (a library lends books to
members, a clinic books slots for patients, ...). All of them share one set of *abstract* task
patterns (lookup, eligibility check, relation replacement, dependent-state validation, create,
update, delete, transfer, notify), so tasks in different environments can have the same shape with
disjoint words. That is what the cross-environment topology edges are meant to find.

Every environment ships executable class code (generated source text, run only in the sandbox),
OpenAI-format tool schemas, and every task ships an ``init_config``, an instruction, a
``checklist_with_func`` (check description + ``check_func(final_state)`` source that may read the
global ``initial_state``) and the gold action sequence.

The latent variables the simulated learner uses (pattern vector, difficulty) are returned
separately (:class:`SyntheticPool.latents`) and stored in their own lake table: schedulers never
read them.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

import numpy as np

PATTERNS = (
    "lookup",
    "eligibility_check",
    "relation_replacement",
    "dependent_state_validation",
    "create",
    "update",
    "delete",
    "transfer",
    "notify",
)

# Domain vocabularies: (domain, entity, entities, owner, owners, field, field values, quantity,
# fee word, assigned status). Each domain appears in three variants (different id shapes, rules
# and tool subsets), giving 51 environments by default.
DOMAINS = [
    (
        "library",
        "book",
        "books",
        "member",
        "members",
        "shelf",
        ["A1", "B2", "C3", "D4", "E5"],
        "copies",
        "late_fee",
        "loaned",
    ),
    (
        "clinic",
        "slot",
        "slots",
        "patient",
        "patients",
        "room",
        ["R101", "R102", "R201", "R305"],
        "capacity",
        "copay",
        "booked",
    ),
    (
        "airline",
        "seat",
        "seats",
        "passenger",
        "passengers",
        "cabin",
        ["economy", "premium", "business"],
        "miles",
        "change_fee",
        "ticketed",
    ),
    (
        "warehouse",
        "pallet",
        "pallets",
        "client",
        "clients",
        "zone",
        ["north", "south", "cold", "bulk"],
        "units",
        "storage_fee",
        "reserved",
    ),
    (
        "hotel",
        "room",
        "rooms",
        "guest",
        "guests",
        "floor",
        ["1", "2", "3", "4", "penthouse"],
        "nights",
        "minibar_charge",
        "occupied",
    ),
    (
        "school",
        "course",
        "courses",
        "student",
        "students",
        "term",
        ["fall", "spring", "summer"],
        "credits",
        "tuition",
        "enrolled",
    ),
    (
        "fleet",
        "vehicle",
        "vehicles",
        "driver",
        "drivers",
        "depot",
        ["east", "west", "central"],
        "fuel",
        "toll",
        "dispatched",
    ),
    (
        "bank",
        "account",
        "accounts",
        "customer",
        "customers",
        "branch",
        ["downtown", "harbor", "airport"],
        "balance_units",
        "overdraft_fee",
        "linked",
    ),
    (
        "gym",
        "locker",
        "lockers",
        "athlete",
        "athletes",
        "wing",
        ["red", "blue", "green"],
        "sessions",
        "locker_fee",
        "rented",
    ),
    (
        "restaurant",
        "table",
        "tables",
        "diner",
        "diners",
        "section",
        ["patio", "bar", "main", "private"],
        "covers",
        "deposit",
        "seated",
    ),
    (
        "hospital",
        "bed",
        "beds",
        "inpatient",
        "inpatients",
        "ward",
        ["icu", "surgical", "maternity"],
        "supplies",
        "ward_charge",
        "admitted",
    ),
    (
        "cinema",
        "screening",
        "screenings",
        "viewer",
        "viewers",
        "hall",
        ["imax", "hall2", "hall3"],
        "tickets",
        "booking_fee",
        "held",
    ),
    (
        "parking",
        "space",
        "spaces",
        "motorist",
        "motorists",
        "level",
        ["p1", "p2", "roof"],
        "hours",
        "parking_fee",
        "allocated",
    ),
    (
        "lab",
        "instrument",
        "instruments",
        "researcher",
        "researchers",
        "bench",
        ["wet", "dry", "clean"],
        "samples",
        "usage_fee",
        "checked_out",
    ),
    (
        "shipping",
        "container",
        "containers",
        "shipper",
        "shippers",
        "berth",
        ["b1", "b2", "b3", "b4"],
        "tons",
        "demurrage",
        "loaded",
    ),
    (
        "coworking",
        "desk",
        "desks",
        "tenant",
        "tenants",
        "area",
        ["quiet", "open", "studio"],
        "passes",
        "guest_fee",
        "leased",
    ),
    (
        "vet",
        "kennel",
        "kennels",
        "owner_of_pet",
        "pet_owners",
        "block",
        ["dogs", "cats", "exotics"],
        "meals",
        "boarding_fee",
        "boarded",
    ),
]

# Environments that the default (training) pool never contains, in two disjoint families:
# ``warmstart`` (behaviour-cloning warm start of the neural learner) and ``unseen`` (held-out
# evaluation on environments never trained on). Same tuple layout as DOMAINS.
EXTRA_DOMAINS = {
    "warmstart": [
        (
            "marina",
            "mooring",
            "moorings",
            "sailor",
            "sailors",
            "dock",
            ["north", "south", "outer"],
            "days",
            "mooring_fee",
            "moored",
        ),
        (
            "museum",
            "exhibit",
            "exhibits",
            "curator",
            "curators",
            "gallery",
            ["west", "east", "atrium"],
            "visitors",
            "insurance_fee",
            "lent",
        ),
        (
            "farm",
            "tractor",
            "tractors",
            "farmer",
            "farmers",
            "plot",
            ["f1", "f2", "f3"],
            "hours_used",
            "rental_fee",
            "leased_out",
        ),
        (
            "theater",
            "costume",
            "costumes",
            "actor",
            "actors",
            "rack",
            ["r1", "r2", "r3"],
            "fittings",
            "cleaning_fee",
            "worn",
        ),
        (
            "studio",
            "camera",
            "cameras",
            "photographer",
            "photographers",
            "kit",
            ["basic", "pro", "cine"],
            "shoots",
            "damage_fee",
            "signed_out",
        ),
        (
            "garden",
            "planter",
            "planters",
            "gardener",
            "gardeners",
            "bed",
            ["sunny", "shade", "raised"],
            "harvests",
            "water_fee",
            "tended",
        ),
        (
            "archive",
            "record",
            "records",
            "archivist",
            "archivists",
            "vault",
            ["v1", "v2", "v3"],
            "pages",
            "retrieval_fee",
            "pulled",
        ),
        (
            "kitchen",
            "burner",
            "burners",
            "chef",
            "chefs",
            "line",
            ["hot", "cold", "pastry"],
            "orders",
            "prep_fee",
            "lit",
        ),
        (
            "airport",
            "gate",
            "gates",
            "crew",
            "crews",
            "terminal",
            ["t1", "t2", "t3"],
            "departures",
            "landing_fee",
            "staffed",
        ),
        (
            "rental",
            "bike",
            "bikes",
            "rider",
            "riders",
            "station",
            ["dock_a", "dock_b", "dock_c"],
            "rides",
            "late_charge",
            "ridden",
        ),
        (
            "harbor",
            "crane",
            "cranes",
            "operator",
            "operators",
            "quay",
            ["q1", "q2", "q3"],
            "lifts",
            "operating_fee",
            "engaged",
        ),
        (
            "library_annex",
            "journal",
            "journals",
            "reader",
            "readers",
            "stack",
            ["s1", "s2", "s3"],
            "issues",
            "reading_fee",
            "borrowed",
        ),
    ],
    "unseen": [
        (
            "observatory",
            "telescope",
            "telescopes",
            "astronomer",
            "astronomers",
            "dome",
            ["alpha", "beta", "gamma"],
            "nights_booked",
            "observing_fee",
            "scheduled",
        ),
        (
            "stable",
            "horse",
            "horses",
            "jockey",
            "jockeys",
            "paddock",
            ["east", "west", "ring"],
            "rides",
            "feed_fee",
            "saddled",
        ),
        (
            "printshop",
            "press",
            "presses",
            "designer",
            "designers",
            "bay",
            ["b1", "b2", "b3"],
            "prints",
            "ink_fee",
            "running",
        ),
        (
            "camp",
            "cabin",
            "cabins",
            "camper",
            "campers",
            "site",
            ["lakeside", "hill", "forest"],
            "nights",
            "site_fee",
            "claimed",
        ),
        (
            "brewery",
            "tank",
            "tanks",
            "brewer",
            "brewers",
            "cellar",
            ["c1", "c2", "c3"],
            "liters",
            "keg_fee",
            "filled",
        ),
        (
            "salon",
            "chair",
            "chairs",
            "stylist",
            "stylists",
            "area",
            ["front", "back", "vip"],
            "appointments",
            "chair_rent",
            "taken",
        ),
        (
            "zoo",
            "enclosure",
            "enclosures",
            "keeper",
            "keepers",
            "zone",
            ["savanna", "arctic", "jungle"],
            "feedings",
            "care_fee",
            "tended",
        ),
        (
            "laundromat",
            "washer",
            "washers",
            "patron",
            "patrons",
            "row",
            ["w1", "w2", "w3"],
            "cycles",
            "soap_fee",
            "spinning",
        ),
        (
            "dojo",
            "mat",
            "mats",
            "student_fighter",
            "student_fighters",
            "hall",
            ["main", "small"],
            "classes",
            "belt_fee",
            "reserved",
        ),
        (
            "greenhouse",
            "tray",
            "trays",
            "grower",
            "growers",
            "house",
            ["h1", "h2", "h3"],
            "seedlings",
            "heating_fee",
            "planted",
        ),
        (
            "ferry",
            "cabin_berth",
            "cabin_berths",
            "traveller",
            "travellers",
            "deck",
            ["upper", "lower"],
            "crossings",
            "port_fee",
            "booked",
        ),
        (
            "pharmacy",
            "batch",
            "batches",
            "pharmacist",
            "pharmacists",
            "shelf_unit",
            ["cold", "dry", "locked"],
            "doses",
            "dispensing_fee",
            "dispensed",
        ),
    ],
}
FAMILIES = ("train", *EXTRA_DOMAINS)

ID_SHAPES = (
    lambda p, i: f"{p[:2].upper()}-{100 + i}",
    lambda p, i: f"{p[:3]}_{i:03d}",
    lambda p, i: f"{p[0].upper()}{7000 + 13 * i}",
)
NAMES = (
    "Ada",
    "Bela",
    "Chen",
    "Dara",
    "Eli",
    "Fatima",
    "Goran",
    "Hana",
    "Ines",
    "Jon",
    "Kofi",
    "Lena",
    "Mira",
    "Nils",
    "Oda",
    "Pavel",
    "Quinn",
    "Rosa",
    "Sami",
    "Tara",
    "Umar",
    "Vera",
    "Wen",
    "Yuki",
)
TITLES = (
    "Atlas",
    "Beacon",
    "Cedar",
    "Delta",
    "Ember",
    "Fjord",
    "Garnet",
    "Harbor",
    "Iris",
    "Juniper",
    "Krypton",
    "Lumen",
    "Meridian",
    "Nimbus",
    "Onyx",
    "Prairie",
    "Quartz",
    "Raven",
    "Sierra",
    "Tundra",
)


@dataclass(frozen=True)
class SyntheticConfig:
    """Size and shape of the generated pool (defaults: the paper's 51 x 50)."""

    n_envs: int = 51
    tasks_per_env: int = 50
    heldout_per_env: int = 4
    seed: int = 0
    env_difficulty_sd: float = 2.2  # spread of environment difficulty (logit units)
    task_difficulty_sd: float = 1.6  # spread of task difficulty within an environment
    difficulty_shift: float = 0.7  # calibrated so random scheduling sees the paper's regime
    family: str = "train"  # train: the default pool | warmstart | unseen: environments it never contains

    def __post_init__(self):
        check_size(self.n_envs, self.tasks_per_env, self.heldout_per_env)


# the generator holds every task in memory (about 22 KB each: 50,000 took 1.1 GB), so a pool of
# this many tasks (held-out ones included) needs about 11 GB
MAX_TASKS = 500_000


def check_size(n_envs: int, tasks_per_env: int, heldout_per_env: int = 4) -> None:
    """A ValueError naming the sizes when the pool would be empty or too large to generate."""
    if n_envs < 1 or tasks_per_env < 1 or heldout_per_env < 0:
        raise ValueError(
            f"a synthetic pool needs environments and tasks (got {n_envs} environments, {tasks_per_env} "
            f"tasks each, {heldout_per_env} held out)"
        )
    total = n_envs * (tasks_per_env + heldout_per_env)
    if total > MAX_TASKS:
        raise ValueError(
            f"{n_envs} environments x {tasks_per_env + heldout_per_env} tasks (held-out ones included) = {total:,} "
            f"tasks; a synthetic pool holds at most {MAX_TASKS:,} (every task is generated in memory, about "
            "1 GB per 50,000)"
        )


@dataclass
class SyntheticPool:
    environments: list[dict]
    tasks: list[dict]  # EnvScaler scenario records (selectable pool)
    heldout: list[dict]  # scenario records used only for held-out evaluation
    latents: list[dict] = field(default_factory=list)  # task_id -> patterns, difficulty, split


def _class_code(env: dict) -> str:
    """Source of the environment class. Executed only inside the sandboxed worker."""
    e, es, o, os_, fld, qty, fee, assigned = (
        env["entity"],
        env["entities"],
        env["owner"],
        env["owners"],
        env["field"],
        env["qty"],
        env["fee"],
        env["assigned"],
    )
    max_assign = env["rules"]["max_assigned_per_" + o]
    return f'''class {env["class_name"]}:
    """{env["summary"]}"""

    def __init__(self, config=None):
        config = dict(config or {{}})
        self.{es} = config.get("{es}", {{}})
        self.{os_} = config.get("{os_}", {{}})
        self.log = config.get("log", [])

    def _{e}(self, {e}_id):
        if {e}_id not in self.{es}:
            raise KeyError("unknown {e}: %s" % {e}_id)
        return self.{es}[{e}_id]

    def _{o}(self, {o}_id):
        if {o}_id not in self.{os_}:
            raise KeyError("unknown {o}: %s" % {o}_id)
        return self.{os_}[{o}_id]

    def get_{e}(self, {e}_id):
        return dict(self._{e}({e}_id), id={e}_id)

    def list_{es}(self, status=None):
        return [dict(v, id=k) for k, v in sorted(self.{es}.items()) if status is None or v["status"] == status]

    def get_{o}(self, {o}_id):
        return dict(self._{o}({o}_id), id={o}_id)

    def find_{e}_by_name(self, name):
        return [k for k, v in sorted(self.{es}.items()) if v["name"] == name]

    def check_{o}_eligibility(self, {o}_id, {e}_id):
        who, what = self._{o}({o}_id), self._{e}({e}_id)
        held = sum(1 for v in self.{es}.values() if v.get("{o}") == {o}_id)
        if what["status"] != "available":
            return {{"eligible": False, "reason": "{e} is " + what["status"]}}
        if who["tier"] == "suspended":
            return {{"eligible": False, "reason": "{o} is suspended"}}
        if held >= {max_assign}:
            return {{"eligible": False, "reason": "{o} already holds {max_assign}"}}
        return {{"eligible": True, "reason": "ok"}}

    def assign_{e}(self, {e}_id, {o}_id):
        what = self._{e}({e}_id)
        self._{o}({o}_id)
        if what["status"] != "available":
            return {{"error": "{e} not available"}}
        what["{o}"] = {o}_id
        what["status"] = "{assigned}"
        self.log.append(["assign", {e}_id, {o}_id])
        return {{"ok": True}}

    def release_{e}(self, {e}_id):
        what = self._{e}({e}_id)
        what["{o}"] = None
        what["status"] = "available"
        self.log.append(["release", {e}_id])
        return {{"ok": True}}

    def update_{e}_{fld}(self, {e}_id, value):
        self._{e}({e}_id)["{fld}"] = value
        return {{"ok": True}}

    def set_{e}_status(self, {e}_id, status):
        self._{e}({e}_id)["status"] = status
        return {{"ok": True}}

    def create_{e}(self, {e}_id, name, {fld}):
        if {e}_id in self.{es}:
            return {{"error": "{e} exists"}}
        self.{es}[{e}_id] = {{"name": name, "{fld}": {fld}, "status": "available", "{o}": None, "{qty}": 0}}
        return {{"ok": True}}

    def delete_{e}(self, {e}_id):
        self._{e}({e}_id)
        del self.{es}[{e}_id]
        return {{"ok": True}}

    def transfer_{qty}(self, from_id, to_id, amount):
        src, dst = self._{e}(from_id), self._{e}(to_id)
        amount = int(amount)
        if amount <= 0 or src["{qty}"] < amount:
            return {{"error": "invalid amount"}}
        src["{qty}"] -= amount
        dst["{qty}"] += amount
        return {{"ok": True}}

    def charge_{fee}(self, {o}_id, amount):
        who = self._{o}({o}_id)
        who["balance"] -= int(amount)
        return {{"ok": True, "balance": who["balance"]}}

    def notify_{o}(self, {o}_id, message):
        self._{o}({o}_id)["inbox"].append(str(message))
        return {{"ok": True}}
'''


def _tool_schemas(env: dict) -> list[dict]:
    e, es, o, fld, qty, fee = (
        env["entity"],
        env["entities"],
        env["owner"],
        env["field"],
        env["qty"],
        env["fee"],
    )

    def tool(tool_name: str, desc: str, /, **params: tuple[str, str]) -> dict:
        return {
            "type": "function",
            "function": {
                "name": tool_name,
                "description": desc,
                "parameters": {
                    "type": "object",
                    "properties": {k: {"type": t, "description": d} for k, (t, d) in params.items()},
                    "required": list(params),
                },
            },
        }

    return [
        tool(f"get_{e}", f"Look up one {e} by id.", **{f"{e}_id": ("string", f"{e} id")}),
        {
            "type": "function",
            "function": {
                "name": f"list_{es}",
                "description": f"List {es}, optionally only those with a status.",
                "parameters": {
                    "type": "object",
                    "properties": {"status": {"type": "string"}},
                    "required": [],
                },
            },
        },
        tool(f"get_{o}", f"Look up one {o} by id.", **{f"{o}_id": ("string", f"{o} id")}),
        tool(f"find_{e}_by_name", f"Ids of the {es} with this name.", name=("string", "exact name")),
        tool(
            f"check_{o}_eligibility",
            f"Whether a {o} may take a {e}.",
            **{f"{o}_id": ("string", ""), f"{e}_id": ("string", "")},
        ),
        tool(
            f"assign_{e}",
            f"Assign an available {e} to a {o}.",
            **{f"{e}_id": ("string", ""), f"{o}_id": ("string", "")},
        ),
        tool(f"release_{e}", f"Release a {e} from its {o}.", **{f"{e}_id": ("string", "")}),
        tool(
            f"update_{e}_{fld}",
            f"Change the {fld} of a {e}.",
            **{f"{e}_id": ("string", ""), "value": ("string", f"new {fld}")},
        ),
        tool(
            f"set_{e}_status",
            f"Set the status of a {e}.",
            **{f"{e}_id": ("string", ""), "status": ("string", "")},
        ),
        tool(
            f"create_{e}",
            f"Create a new {e}.",
            **{f"{e}_id": ("string", ""), "name": ("string", ""), fld: ("string", "")},
        ),
        tool(f"delete_{e}", f"Delete a {e}.", **{f"{e}_id": ("string", "")}),
        tool(
            f"transfer_{qty}",
            f"Move {qty} between two {es}.",
            from_id=("string", ""),
            to_id=("string", ""),
            amount=("integer", ""),
        ),
        tool(
            f"charge_{fee}",
            f"Charge a {o} a {fee}.",
            **{f"{o}_id": ("string", ""), "amount": ("integer", "")},
        ),
        tool(
            f"notify_{o}",
            f"Send a message to a {o}.",
            **{f"{o}_id": ("string", ""), "message": ("string", "")},
        ),
    ]


def _make_env(idx: int, rng: np.random.Generator, domains: list = DOMAINS) -> dict:
    dom = domains[idx % len(domains)]
    variant = idx // len(domains)
    domain, e, es, o, os_, fld, vals, qty, fee, assigned = dom
    env_id = f"{domain}_{variant}" if idx >= len(domains) else domain
    class_name = "".join(w.capitalize() for w in env_id.split("_")) + "Service"
    max_assign = int(rng.integers(1, 4))
    env = {
        "env_id": env_id,
        "domain": domain,
        "variant": variant,
        "class_name": class_name,
        "entity": e,
        "entities": es,
        "owner": o,
        "owners": os_,
        "field": fld,
        "field_values": list(vals),
        "qty": qty,
        "fee": fee,
        "assigned": assigned,
        "id_shape": (variant if domains is DOMAINS else idx) % len(ID_SHAPES),
        "rules": {f"max_assigned_per_{o}": max_assign, "suspended_may_not_hold": True},
        "summary": f"A {domain} service that manages {es} and the {os_} who hold them.",
        "introduction": (
            f"You operate the {domain} system. Each {e} has a name, a {fld}, a status and {qty}; "
            f"each {o} has a tier, a balance and an inbox. Use the tools to read and change state."
        ),
        "rules_text": (
            f"A {o} may hold at most {max_assign} {es}. Suspended {os_} may not take a {e}. "
            f"Only available {es} can be assigned."
        ),
    }
    env["tools"] = _tool_schemas(env)
    env["code"] = _class_code(env)
    return env


def _init_state(env: dict, rng: np.random.Generator) -> dict:
    shape = ID_SHAPES[env["id_shape"]]
    n_items, n_owners = int(rng.integers(4, 8)), int(rng.integers(3, 6))
    owners = {}
    for j in range(n_owners):
        owners[shape(env["owner"], j)] = {
            "name": str(rng.choice(NAMES)),
            "tier": str(rng.choice(["basic", "gold", "suspended"], p=[0.55, 0.3, 0.15])),
            "balance": int(rng.integers(20, 200)),
            "inbox": [],
        }
    oids = list(owners)
    items = {}
    for j in range(n_items):
        held = rng.random() < 0.35
        items[shape(env["entity"], j)] = {
            "name": f"{rng.choice(TITLES)} {rng.integers(1, 99)}",
            env["field"]: str(rng.choice(env["field_values"])),
            "status": env["assigned"] if held else "available",
            env["owner"]: str(rng.choice(oids)) if held else None,
            env["qty"]: int(rng.integers(1, 30)),
        }
    return {env["entities"]: items, env["owners"]: owners, "log": []}


def _acc(path: list[str]) -> str:
    return "final_state" + "".join(f"[{json.dumps(p)}]" for p in path)


def _init(path: list[str]) -> str:
    return "initial_state" + "".join(f"[{json.dumps(p)}]" for p in path)


def _check(item: str, expr: str) -> dict:
    return {"check_item": item, "check_func": f"def check_func(final_state):\n    return {expr}\n"}


def _make_task(env: dict, patterns: list[str], rng: np.random.Generator) -> dict:
    """One task: instruction clauses, gold actions and checks, one block per abstract pattern."""
    state = _init_state(env, rng)
    e, es, o, os_, fld, qty, fee = (
        env["entity"],
        env["entities"],
        env["owner"],
        env["owners"],
        env["field"],
        env["qty"],
        env["fee"],
    )
    items, owners = state[es], state[os_]
    iids, oids = list(items), list(owners)
    clauses: list[str] = []
    gold: list[dict] = []
    checks: list[dict] = []
    by_name = "lookup" in patterns
    touched: set[str] = set()

    def ref(iid: str) -> str:
        # lookup tasks refer to an item by its (unique) name; the agent must resolve the id.
        if by_name:
            gold.append({"name": f"find_{e}_by_name", "arguments": {"name": items[iid]["name"]}})
            return f"the {e} named '{items[iid]['name']}'"
        return f"{e} {iid}"

    if by_name:  # make names unique so lookups resolve to exactly one id
        for j, iid in enumerate(iids):
            items[iid]["name"] = f"{TITLES[j % len(TITLES)]} {j + 1}"

    deleted: set[str] = set()
    owners_touched: set[str] = set()
    for pat in patterns:
        if pat == "lookup":
            continue
        iids = [i for i in items if i not in deleted]  # later clauses never touch a deleted item
        free = [i for i in iids if items[i]["status"] == "available"]
        if pat == "update":
            iid = str(rng.choice(iids))
            val = str(rng.choice([v for v in env["field_values"] if v != items[iid][fld]]))
            clauses.append(f"Move {ref(iid)} to {fld} {val}.")
            gold.append({"name": f"update_{e}_{fld}", "arguments": {f"{e}_id": iid, "value": val}})
            checks.append(
                _check(f"{e} {iid} has {fld} {val}", f"{_acc([es, iid, fld])} == {json.dumps(val)}")
            )
            touched.add(iid)
        elif pat == "create":
            new_id = ID_SHAPES[env["id_shape"]](e, 90 + int(rng.integers(0, 9)))
            name = f"{rng.choice(TITLES)} {rng.integers(100, 999)}"
            val = str(rng.choice(env["field_values"]))
            clauses.append(f"Register a new {e} {new_id} called '{name}' in {fld} {val}.")
            gold.append({"name": f"create_{e}", "arguments": {f"{e}_id": new_id, "name": name, fld: val}})
            checks.append(
                _check(f"{e} {new_id} exists", f"{json.dumps(new_id)} in final_state[{json.dumps(es)}]")
            )
            checks.append(
                _check(
                    f"{e} {new_id} is named {name}", f"{_acc([es, new_id])}.get('name') == {json.dumps(name)}"
                )
            )
        elif pat == "delete":
            cands = [i for i in iids if i not in touched] or iids
            iid = str(rng.choice(cands))
            clauses.append(f"Retire {ref(iid)} permanently.")
            gold.append({"name": f"delete_{e}", "arguments": {f"{e}_id": iid}})
            checks.append(
                _check(f"{e} {iid} is deleted", f"{json.dumps(iid)} not in final_state[{json.dumps(es)}]")
            )
            touched.add(iid)
            deleted.add(iid)
        elif pat == "relation_replacement":
            held = [i for i in iids if items[i][o] and i not in touched]
            untouched = [i for i in iids if i not in touched] or iids
            iid = str(rng.choice(held)) if held else str(rng.choice(untouched))
            cur = items[iid][o]
            new = str(rng.choice([x for x in oids if x != cur]))
            owners_touched.update(x for x in (cur, new) if x)
            clauses.append(f"Hand {ref(iid)} over from its current {o} to {o} {new}.")
            if items[iid]["status"] != "available":
                gold.append({"name": f"release_{e}", "arguments": {f"{e}_id": iid}})
            gold.append({"name": f"assign_{e}", "arguments": {f"{e}_id": iid, f"{o}_id": new}})
            checks.append(_check(f"{e} {iid} belongs to {new}", f"{_acc([es, iid, o])} == {json.dumps(new)}"))
            checks.append(
                _check(
                    f"{e} {iid} is {env['assigned']}",
                    f"{_acc([es, iid, 'status'])} == {json.dumps(env['assigned'])}",
                )
            )
            touched.add(iid)
        elif pat == "eligibility_check":
            iid = str(
                rng.choice(
                    [i for i in free if i not in touched] or [i for i in iids if i not in touched] or iids
                )
            )
            oid = str(rng.choice([x for x in oids if x not in owners_touched] or oids))
            owners_touched.add(oid)
            clauses.append(
                f"If {o} {oid} is eligible, give them {ref(iid)}; otherwise tell them why in a message."
            )
            gold.append({"name": f"check_{o}_eligibility", "arguments": {f"{o}_id": oid, f"{e}_id": iid}})
            held_n = sum(1 for v in items.values() if v[o] == oid)
            ok = (
                items[iid]["status"] == "available"
                and owners[oid]["tier"] != "suspended"
                and held_n < env["rules"][f"max_assigned_per_{o}"]
            )
            if ok:
                gold.append({"name": f"assign_{e}", "arguments": {f"{e}_id": iid, f"{o}_id": oid}})
                checks.append(
                    _check(
                        f"{e} {iid} assigned to eligible {oid}", f"{_acc([es, iid, o])} == {json.dumps(oid)}"
                    )
                )
            else:
                gold.append({"name": f"notify_{o}", "arguments": {f"{o}_id": oid, "message": "not eligible"}})
                checks.append(
                    _check(
                        f"ineligible {oid} was told",
                        f"len({_acc([os_, oid, 'inbox'])}) > len({_init([os_, oid, 'inbox'])})",
                    )
                )
                checks.append(
                    _check(f"{e} {iid} keeps its {o}", f"{_acc([es, iid, o])} == {_init([es, iid, o])}")
                )
            touched.add(iid)
        elif pat == "transfer":
            a, b = (str(x) for x in rng.choice(iids, size=2, replace=False))
            n = int(rng.integers(1, max(2, items[a][qty])))
            clauses.append(f"Shift {n} {qty} from {ref(a)} to {ref(b)}.")
            gold.append({"name": f"transfer_{qty}", "arguments": {"from_id": a, "to_id": b, "amount": n}})
            checks.append(
                _check(f"{a} lost {n} {qty}", f"{_acc([es, a, qty])} == {_init([es, a, qty])} - {n}")
            )
            checks.append(
                _check(f"{b} gained {n} {qty}", f"{_acc([es, b, qty])} == {_init([es, b, qty])} + {n}")
            )
            touched.update((a, b))
        elif pat == "dependent_state_validation":
            oid = str(rng.choice(oids))
            amt = int(rng.integers(5, 40))
            clauses.append(f"Apply a {fee} of {amt} to {o} {oid} so their balance stays consistent.")
            gold.append({"name": f"charge_{fee}", "arguments": {f"{o}_id": oid, "amount": amt}})
            checks.append(
                _check(
                    f"{oid} balance reduced by {amt}",
                    f"{_acc([os_, oid, 'balance'])} == {_init([os_, oid, 'balance'])} - {amt}",
                )
            )
        elif pat == "notify":
            oid = str(rng.choice(oids))
            word = str(rng.choice(["schedule", "policy", "renewal", "closure", "upgrade"]))
            clauses.append(f"Send {o} {oid} a note about the {word}.")
            gold.append(
                {"name": f"notify_{o}", "arguments": {f"{o}_id": oid, "message": f"update on {word}"}}
            )
            checks.append(
                _check(
                    f"{oid} got a {word} note",
                    f"any({json.dumps(word)} in m for m in {_acc([os_, oid, 'inbox'])})",
                )
            )
    # Pad to at least three checks with "nothing else broke" checks, which most rollouts pass:
    # this is where the fixed partial credit of a failed rollout comes from.
    spare = [i for i in items if i not in touched]
    while len(checks) < 3 and spare:
        iid = spare.pop()
        checks.append(_check(f"{e} {iid} left untouched", f"{_acc([es, iid])} == {_init([es, iid])}"))
    return {
        "init_config": state,
        "task": " ".join(clauses),
        "checklist_with_func": checks[:8],
        "gold_actions": gold,
    }


def content_hash(record: dict) -> str:
    """Stable task identity: hash of what defines the task, not of its position or name."""
    keys = ("env_id", "task", "init_config", "checklist_with_func")
    blob = json.dumps({k: record.get(k) for k in keys}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def generate(config: SyntheticConfig = SyntheticConfig()) -> SyntheticPool:
    """Generate the pool. Deterministic for a config (seed included)."""
    if config.n_envs < 1 or config.tasks_per_env < 1:
        raise ValueError("n_envs and tasks_per_env must be >= 1")
    if config.family not in FAMILIES:
        raise ValueError(f"unknown environment family {config.family!r}; choose one of {', '.join(FAMILIES)}")
    domains = DOMAINS if config.family == "train" else EXTRA_DOMAINS[config.family]
    rng = np.random.default_rng(config.seed)
    envs, tasks, heldout, latents = [], [], [], []
    # Each environment favours a few patterns; shared patterns are what transfers across envs.
    for k in range(config.n_envs):
        env = _make_env(k, rng, domains)
        env_offset = float(rng.normal(0.0, config.env_difficulty_sd))
        favoured = rng.dirichlet(np.full(len(PATTERNS), 0.6))
        envs.append(
            {
                key: env[key]
                for key in (
                    "env_id",
                    "class_name",
                    "summary",
                    "introduction",
                    "rules_text",
                    "tools",
                    "code",
                    "domain",
                )
            }
        )
        n_total = config.tasks_per_env + config.heldout_per_env
        for j in range(n_total):
            n_pat = int(rng.choice([1, 2, 3], p=[0.35, 0.45, 0.2]))
            pats = list(rng.choice(len(PATTERNS), size=n_pat, replace=False, p=favoured))
            names = [PATTERNS[p] for p in sorted(pats)]
            if names == ["lookup"]:
                names = ["lookup", "update"]
            body = _make_task(env, names, rng)
            split = "train" if j < config.tasks_per_env else "heldout"
            task_id = f"{env['env_id']}-{'t' if split == 'train' else 'h'}{j:03d}"
            record = {
                "task_id": task_id,
                "env_id": env["env_id"],
                "env_class_name": env["class_name"],
                **body,
            }
            (tasks if split == "train" else heldout).append(record)
            z = np.zeros(len(PATTERNS))
            z[[PATTERNS.index(n) for n in names]] = 1.0
            difficulty = (
                config.difficulty_shift
                + env_offset
                + float(rng.normal(0.0, config.task_difficulty_sd))
                + 0.35 * len(names)
            )
            # Partial credit of a failed rollout: the checks the policy always gets right.
            k_checks = len(body["checklist_with_func"])
            easy = int(rng.integers(1, k_checks)) if k_checks > 1 else 0
            latents.append(
                {
                    "task_id": task_id,
                    "env_id": env["env_id"],
                    "split": split,
                    "patterns": json.dumps(names),
                    "z": z.tolist(),
                    "difficulty": difficulty,
                    "n_checks": k_checks,
                    "easy_checks": easy,
                }
            )
    return SyntheticPool(environments=envs, tasks=tasks, heldout=heldout, latents=latents)
