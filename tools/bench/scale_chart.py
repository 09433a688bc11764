"""The store-scaling study's chart (``tools.bench.store_scale --png``), drawn like the benchmark's
others (``report.figure``, ``report.save_png``): against store size in tokens (log scale), the
accepted tokens per step (left) and the speed-up over plain greedy ``generate`` (right), each with
the no-store configuration as a dashed line."""

from __future__ import annotations

from tools.bench.report import figure, save_png


def plot_scale(result: dict, path: str) -> None:
    """A PNG of ``result`` (``store_scale.run_study``'s record) at ``path``."""
    rows, base = result["sizes"], result["no_store"]
    tokens = [row["tokens"] for row in rows]
    panels = (("accepted_per_step", "accepted tokens per step\n(bonus token included)"),
              ("speedup_vs_greedy", "speed-up over plain greedy generate\n(wall seconds)"))
    fig, axes = figure(ncols=2, figsize=(10, 3.8))
    for ax, (key, label) in zip(axes, panels):
        ax.plot(tokens, [row["generate"][key] for row in rows], marker="o", label="with the store")
        ax.axhline(base[key], color="gray", linestyle="--", linewidth=1, label="no store")
        ax.set_xscale("log")
        ax.set_xlabel("store size (tokens)")
        ax.set_ylabel(label, fontsize=8)
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=7, loc="lower right")
    config, machine = result["config"], result["machine"]
    fig.suptitle(f"{config['model']}: {config['prompts']} HumanEval prompts x {config['max_new_tokens']} new tokens, "
                 f"{machine['cores']} cores ({machine['cpu']}), cache {result['cache'].get('mode', 'n/a')}", fontsize=9)
    fig.tight_layout()
    save_png(fig, path)
