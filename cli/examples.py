"""Examples shown at the end of every command's `--help` (a test parses each one with its command)."""

from __future__ import annotations

import click

__all__ = ["EXAMPLES", "add_examples"]

SEED = "/ip4/203.0.113.7/tcp/31337/p2p/12D3KooWRawPbxPtP1eZaJpumGnyWX2DcUyd3RQnydr3eAto4Az7"
TRAINER = "12D3KooWB8sCGZCrwr79HtabLAn95qyPQx6RYHXjEbiD6QKou7ww"

EXAMPLES: dict[str, list[str]] = {
    "identity": ["hivenet identity --create", "hivenet identity --identity ./node.key --json"],
    "join": [
        f"hivenet join --initial-peers {SEED} --role trainer --run my-run",
        f"hivenet join --initial-peers {SEED} --role inference --rl --publisher {TRAINER}",
        "hivenet join --config /etc/hivenet/config.toml --status-port 8790 --metrics-host 0.0.0.0",
    ],
    "seed": [
        "hivenet seed --port 31337 --identity ./seed.key",
        "hivenet seed --port 31337 --announce-ip 203.0.113.7",
    ],
    "peers": [
        f"hivenet peers --initial-peers {SEED} --run my-run",
        f"hivenet peers --initial-peers {SEED} --json",
    ],
    "doctor": ["hivenet doctor", f"hivenet doctor --initial-peers {SEED} --port 31337"],
    "simulate": [
        "hivenet simulate --nodes 4 --duration 30",
        "hivenet simulate --trainers 4 --outer-steps 10",
        "hivenet simulate --rl --model ./llama-tiny --verification-policy policy.json --workers 3",
    ],
    "weights publish": [
        f"hivenet weights publish model.safetensors --run my-run --version 1 --initial-peers {SEED}"
    ],
    "weights fetch": [
        f"hivenet weights fetch --run my-run --out ./weights --initial-peers {SEED} --publisher {TRAINER}",
        f"hivenet weights fetch --run my-run --out ./weights --follow --initial-peers {SEED} --publisher {TRAINER}",
    ],
    "weights status": [f"hivenet weights status --run my-run --initial-peers {SEED} --publisher {TRAINER}"],
    "ledger export": ["hivenet ledger export --db node.ledger.db --out receipts.jsonl"],
    "ledger import": ["hivenet ledger import receipts.jsonl --db audit.ledger.db"],
    "ledger verify": [f"hivenet ledger verify receipts.jsonl --trainer {TRAINER}"],
    "ledger credit": [f"hivenet ledger credit --db node.ledger.db --trainer {TRAINER} --top 10"],
    "dashboard": [f"hivenet dashboard --run my-run --initial-peers {SEED} --trainer {TRAINER}"],
    "model init": [
        "hivenet model init ./llama-tiny",
        "hivenet model init ./qwen-micro --family qwen2 --size micro",
    ],
    "model info": ["hivenet model info ./llama-tiny --json"],
    "calibrate": [
        "hivenet calibrate --model ./llama-tiny --dtype float32 --out policy.json",
        "hivenet calibrate --model ./llama-tiny --dtype bfloat16 --device cuda --out policy.json",
    ],
}
"""Per command path (as typed after `hivenet`), the examples its help ends with."""


def add_examples(group: click.Group, prefix: str = "") -> list[str]:
    """Set each command's help epilog to its examples, recursively (KeyError for a command without
    any); a group's help shows the first example of each of its commands. Returns the group's."""
    shown = []
    for name, command in group.commands.items():
        path = f"{prefix}{name}"
        if isinstance(command, click.Group):
            examples = add_examples(command, f"{path} ")
        else:
            examples = EXAMPLES[path]
            command.epilog = _epilog(examples)
        shown.append(examples[0])
    group.epilog = _epilog(shown)
    return shown


def _epilog(examples: list[str]) -> str:
    lines = "\n".join(f"  {example}" for example in examples)
    return f"\b\nExamples:\n{lines}"  # \b: click keeps these lines as they are
