"""What the API returns: the command line's ``--json`` answers as dicts, which print as a few
readable lines (``repr``) and as a small table in a notebook (``_repr_html_``)."""

import html


def _size(n):
    """Bytes as PyTorch's memory_summary writes them (binary units)."""
    if not isinstance(n, (int, float)):
        return str(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.2f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return str(n)


class Result(dict):
    """One ``--json`` answer (a dict), named by what it is: "summary", "replay", "run", ...."""

    def __init__(self, data, kind):
        super().__init__(data)
        self.kind = kind

    def _lines(self):
        """(label, value) rows worth a first look."""
        rows = []
        if "device" in self:
            rows.append(("device", self["device"]))
        for key in ("scenario", "variant"):
            if self.get(key) is not None:
                rows.append((key, self[key]))
        for key, value in self.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool) and key.endswith("_bytes"):
                rows.append((key, _size(value)))
        stats = self.get("memory_stats")
        if isinstance(stats, dict):
            for key in ("allocated_bytes.all.peak", "reserved_bytes.all.peak", "num_ooms"):
                if key in stats:
                    rows.append((key, _size(stats[key]) if key.endswith("peak") else stats[key]))
        return rows

    def __repr__(self):
        rows = self._lines()
        body = ", ".join(f"{k}={v}" for k, v in rows) if rows else f"{len(self)} fields"
        return f"<tensormem {self.kind}: {body}>"

    def _repr_html_(self):
        rows = "".join(f"<tr><th style='text-align:left'>{html.escape(str(k))}</th><td>{html.escape(str(v))}</td></tr>" for k, v in self._lines())
        return f"<table><caption>tensormem {html.escape(self.kind)}</caption>{rows}</table>"


class Diagnosis(Result):
    """The doctor's answer: ``findings``, each with kind, title, bytes, evidence, why, fix and
    confidence, the out-of-memory first."""

    def __init__(self, data):
        super().__init__(data, "diagnosis")

    @property
    def findings(self):
        return self.get("findings", [])

    def _in_print_order(self):
        """An out-of-memory first (what a person who hit one reads first), the rest as ranked."""
        return sorted(self.findings, key=lambda f: f.get("kind") != "oom")

    def __repr__(self):
        lines = [f"<tensormem diagnosis: {len(self.findings)} findings>"]
        # What the trace cannot decide comes apart, after the findings, as the command line says it.
        ordered = self._in_print_order()
        decided = [f for f in ordered if f.get("confidence") != "inconclusive"]
        undecided = [f for f in ordered if f.get("confidence") == "inconclusive"]
        for f in decided:
            lines.append(f"  [{f.get('kind')}] {f.get('title')}")
            if f.get("fix"):
                lines.append(f"      fix: {f['fix']}")
        if undecided:
            lines.append("  the trace cannot decide (inconclusive):")
            lines.extend(f"  [{f.get('kind')}?] {f.get('title')}" for f in undecided)
        return "\n".join(lines)

    def _repr_html_(self):
        rows = "".join(
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>".format(
                html.escape(str(f.get("label", f.get("kind")))),
                html.escape(_size(f.get("bytes", 0))),
                html.escape(str(f.get("title", ""))),
                html.escape(str(f.get("fix") or "")),
            )
            for f in self._in_print_order()
        )
        head = "<tr><th>kind</th><th>bytes</th><th>finding</th><th>fix</th></tr>"
        return f"<table><caption>tensormem doctor</caption>{head}{rows}</table>"


class Results(list):
    """One answer per device (``summary``, ``replay``)."""

    def __repr__(self):
        return "\n".join(repr(r) for r in self) if self else "<tensormem: no devices>"

    def _repr_html_(self):
        return "".join(r._repr_html_() for r in self)
