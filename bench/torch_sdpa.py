#!/usr/bin/env python3
"""PyTorch SDPA baselines for flash-attn-bench (`--compare torch`); driven by bench/torch.ts.

Two modes, one request format and one answer format (--serve adds the cell requests below):
  one-shot (no flag): reads ONE JSON request on stdin (to EOF) and writes ONE JSON object
    {"env": ..., "rows": ...} on stdout.
  --serve (a worker, what bench/torch.ts runs): imports torch and checks CUDA once, writes one
    line {"env": ...}, then reads requests, one JSON object per line on stdin (blank lines are
    skipped), and answers each with one line, stdout flushed after each. A request as below is
    answered {"rows": [...]}; the cell requests ("Cell requests" below) time one cell in rounds that
    the client drives. After a request (after a cell's "end") it frees what it allocated (tensors,
    then torch.cuda.empty_cache()). EOF on stdin ends it (exit 0). The bench times each cell with
    cell requests, ours and this worker taking turns round by round.
Progress and diagnostics go to stderr only (`progress <done> <total>` lines, one per cell x backend
of the current request, starting at `progress 0 <total>`, for the bridge; cell requests write none:
their client knows where it stands).

Request:
  {"cells": [{"id": str, "batch": int, "seqlenQ": int, "seqlenK": int, "headsQ": int,
              "headsKV": int, "headDim": int, "causal": bool,
              "dtype": "float32" | "float16" | "bfloat16", "pass": "fwd" | "bwd" | "fwdbwd"}],
   "backends": ["flash", "cudnn", "efficient", "math"],   # any non-empty subset, in this order of rows
   "warmup": int >= 0, "warmupMs": int >= 0 (optional, default 0), "repeats": int >= 1,
   "seed": int (optional, default 0),
   "allowMaterializedMask": bool (optional, default false; see "Causal alignment")}

Answer (one-shot, exit 0):
  {"env": {"torch", "cuda", "cudnn", "device", "capability", "driver", "python"},
   "rows": [{"id", "backend", "msMedian", "msMin", "msMax", "peakBytes", "mask", "error"}]}
  One row per cell x backend. A row whose "error" is a string has null timings and peakBytes.
  "mask" says how the causal mask was given to PyTorch (see below).
  --serve writes the "env" object once, as the line {"env": {...}}, and each request's "rows" as the
  line {"rows": [...]}.
Cell requests (--serve only): one cell, its timed rounds taking turns with the client's own.
  {"op": "begin", "cell": {...one cell as in "cells"...}, "backends", "warmup", "warmupMs",
   "repeats", "seed", "allowMaterializedMask"}   (those keys as in a request)
    prepares the cell on each backend as a request does before its timed rounds (inputs, causal
    plan, the memory run, warm-up) and answers {"ready": true, "rounds": [int, ...]}: the repeats of
    each round, cell_rounds(repeats) (min(INTERLEAVE_ROUNDS, repeats) rounds, as even as can be, the
    first rounds one more), whatever number of backends prepared (a backend that failed, even all
    of them, keeps its error row for "end").
  {"op": "round", "index": i}   i = 0, 1, ... in order, each once
    times round i's repeats on each prepared backend in turn; answers {"ok": true}.
  {"op": "end"}   after the last round
    answers {"rows": [...]}, the cell's rows as a request's, then frees the cell's tensors and
    empties the cache.
  Out of order (round or end with no cell begun, begin or a request while a cell is open, an index
  other than the next round's, end before the last round) is a malformed request.

Failure: one line {"error": str} on stdout, then exit 3 when PyTorch is missing or cannot use CUDA
(--serve: at startup, before the env line); exit 2 for a malformed request (--serve: the first
malformed line ends the worker).

Inputs: torch.randn (never zeros) in the requested dtype on the GPU, laid out [B, S, H, D]
contiguous like flash-attn-node's tensors, handed to SDPA as .transpose(1, 2) views ([B, H, S, D]).
GQA (headsQ != headsKV) passes enable_gqa=True.

Causal alignment: flash-attn-node (FlashAttention-2) aligns the causal mask to the bottom-right
corner; SDPA's is_causal=True aligns it top-left. They agree when seqlenQ == seqlenK ("mask":
"causal"). Otherwise the cell is run with torch.nn.attention.bias.causal_lower_right(Sq, Sk), whose
dispatch (torch/nn/attention/bias.py) honours the sdpa_kernel selection and uses:
  - the flash kernel with its own causal flag, which is bottom-right for that op
    ("mask": "lower_right_fused");
  - else the memory-efficient kernel with custom_mask_type = LOWER_RIGHT ("lower_right_fused");
  - else SDPA with a dense [Sq, Sk] boolean mask ("lower_right_materialized"): no causal
    block skipping, an extra mask read, so NOT comparable with a causal kernel. For flash, cudnn
    and efficient that row is an error unless the request sets allowMaterializedMask (math always
    materialises its mask, so it runs). cuDNN takes this path: PyTorch's cuDNN SDPA has no
    bottom-right causal mask.
  If the dispatch cannot be predicted (private helpers moved), the cell runs and "mask" is
  "lower_right".

Timing: per backend, `warmup` untimed runs, then more in batches of 1, 2, 4, ... (synchronised after
each) until `warmupMs` milliseconds have passed since the first; then `repeats` runs each bracketed by
CUDA events (torch.cuda.Event(enable_timing=True)); median, min and max in milliseconds. A cell's
backends are all warmed up first and their timed runs then take turns in the rounds of
cell_rounds(repeats) (a request with one backend that prepared times it in one round), so that GPU
clocks drifting under sustained load do not favour the backend timed first.
  fwd:    out = sdpa(q, k, v) on inputs without requires_grad (inference forward).
  bwd:    the forward is run once per input set with requires_grad inputs; each repeat times
          torch.autograd.grad(out, (q, k, v), dout, retain_graph=True).
  fwdbwd: each repeat times the forward and torch.autograd.grad together.
Cache: H100/H200 have a 50 MiB L2. When a cell's working set (q, k, v, out, plus dout, dq, dk, dv for
the backward) is below 256 MiB, 3 independent input sets are allocated and the repeats rotate
among them, so a repeat never finds its inputs in L2 from the previous one; larger cells use one set.
Peak memory: after the inputs (and for bwd the saved forwards) exist, synchronize,
reset_peak_memory_stats, base = memory_allocated(); one repeat; peakBytes = max_memory_allocated()
- base (what the kernel allocates above its inputs: output, lse, gradients, workspace).

Python >= 3.9; no dependencies beyond torch. `--plan` (one-shot only) prints the validated request
with each cell's working set and number of input sets, without importing torch.
"""
import gc
import json
import platform
import re
import statistics
import subprocess
import sys
import time
import warnings

BACKENDS = ("flash", "cudnn", "efficient", "math")
DTYPES = {"float32": 4, "float16": 2, "bfloat16": 2}
PASSES = ("fwd", "bwd", "fwdbwd")
ROTATE_BELOW_BYTES = 256 * 1024 * 1024
ROTATE_SETS = 3
INTERLEAVE_ROUNDS = 5  # rounds in which a cell's backends take turns at their timed repeats
EXIT_BAD_REQUEST = 2
EXIT_UNAVAILABLE = 3


class RequestError(ValueError):
    """The request on stdin does not follow the contract."""


def log(msg):
    sys.stderr.write(msg + "\n")
    sys.stderr.flush()


def fail(message, code):
    sys.stdout.write(json.dumps({"error": message}) + "\n")
    sys.stdout.flush()
    sys.exit(code)


def _int(obj, key, where, minimum):
    v = obj.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise RequestError("%s: %s must be an integer >= %d (got %r)" % (where, key, minimum, v))
    return v


def load_object(text):
    """The JSON object on a request line; raises RequestError."""
    try:
        obj = json.loads(text)
    except ValueError as e:
        raise RequestError("request is not JSON: %s" % e)
    if not isinstance(obj, dict):
        raise RequestError("request must be a JSON object")
    return obj


def check_cell(c, where, seen=()):
    """One cell of a request (or of a begin), checked, with only the keys of the contract; its id
    must not be in `seen` (the ids of the request's cells before it)."""
    if not isinstance(c, dict):
        raise RequestError("%s must be an object" % where)
    cid = c.get("id")
    if not isinstance(cid, str) or not cid:
        raise RequestError("%s: id must be a non-empty string" % where)
    if cid in seen:
        raise RequestError("%s: duplicate id %r" % (where, cid))
    cell = {"id": cid}
    for key in ("batch", "seqlenQ", "seqlenK", "headsQ", "headsKV", "headDim"):
        cell[key] = _int(c, key, where, 1)
    if cell["headsQ"] % cell["headsKV"] != 0:
        raise RequestError("%s: headsQ (%d) must be a multiple of headsKV (%d)"
                           % (where, cell["headsQ"], cell["headsKV"]))
    if not isinstance(c.get("causal"), bool):
        raise RequestError("%s: causal must be true or false" % where)
    cell["causal"] = c["causal"]
    if c.get("dtype") not in DTYPES:
        raise RequestError("%s: dtype must be one of %s (got %r)" % (where, ", ".join(DTYPES), c.get("dtype")))
    cell["dtype"] = c["dtype"]
    if c.get("pass") not in PASSES:
        raise RequestError("%s: pass must be one of %s (got %r)" % (where, ", ".join(PASSES), c.get("pass")))
    cell["pass"] = c["pass"]
    return cell


def check_settings(req, where):
    """What every cell of a request (or a begin's cell) is run with, checked, defaults filled in."""
    backends = req.get("backends")
    if (not isinstance(backends, list) or not backends
            or any(b not in BACKENDS for b in backends) or len(set(backends)) != len(backends)):
        raise RequestError("backends must be a non-empty list of distinct names from %s (got %r)"
                           % (", ".join(BACKENDS), backends))
    seed = req.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise RequestError("seed must be an integer (got %r)" % (seed,))
    allow = req.get("allowMaterializedMask", False)
    if not isinstance(allow, bool):
        raise RequestError("allowMaterializedMask must be true or false")
    return {
        "backends": list(backends), "warmup": _int(req, "warmup", where, 0),
        "warmupMs": _int(req, "warmupMs", where, 0) if "warmupMs" in req else 0,
        "repeats": _int(req, "repeats", where, 1), "seed": seed, "allowMaterializedMask": allow,
    }


def check_request(req):
    """A request object (cells and settings) checked, with defaults filled in; raises RequestError."""
    cells = req.get("cells")
    if not isinstance(cells, list):
        raise RequestError("cells must be a list")
    out_cells = []
    seen = set()
    for i, c in enumerate(cells):
        cell = check_cell(c, "cells[%d]" % i, seen)
        seen.add(cell["id"])
        out_cells.append(cell)
    return dict(check_settings(req, "request"), cells=out_cells)


def parse_request(text):
    """Validates the request and returns it with defaults filled in; raises RequestError."""
    return check_request(load_object(text))


def parse_serve_line(text):
    """One --serve line: ("cells", request), ("begin", request of the one cell), ("round", index) or
    ("end", None); raises RequestError. A line without "op" is a request as in one-shot mode."""
    obj = load_object(text)
    if "op" not in obj:
        return "cells", check_request(obj)
    op = obj["op"]
    if op == "begin":
        return "begin", dict(check_settings(obj, "begin"), cells=[check_cell(obj.get("cell"), "begin: cell")])
    if op == "round":
        return "round", _int(obj, "index", "round", 0)
    if op == "end":
        return "end", None
    raise RequestError("op must be one of begin, round, end (got %r)" % (op,))


def working_set_bytes(cell):
    """Bytes one input set touches: q, k, v, out (+ dout, dq, dk, dv for a backward)."""
    q = cell["batch"] * cell["seqlenQ"] * cell["headsQ"] * cell["headDim"]
    kv = cell["batch"] * cell["seqlenK"] * cell["headsKV"] * cell["headDim"]
    elems = 2 * q + 2 * kv  # q, out; k, v
    if cell["pass"] != "fwd":
        elems += 2 * q + 2 * kv  # dout, dq; dk, dv
    return elems * DTYPES[cell["dtype"]]


def input_sets(cell):
    """How many input sets the repeats rotate among (see the module docstring)."""
    return ROTATE_SETS if working_set_bytes(cell) < ROTATE_BELOW_BYTES else 1


def one_line(text, limit=300):
    """PyTorch's messages can span many lines; keep the first meaningful one, shortened."""
    lines = [ln.strip() for ln in str(text).splitlines() if ln.strip()]
    s = lines[0] if lines else "unknown error"
    return s if len(s) <= limit else s[: limit - 3] + "..."


def kernel_reasons(messages):
    """The informative part of PyTorch's "why not this kernel" warnings, deduplicated."""
    out = []
    for m in messages:
        m = re.sub(r"\s*\(Triggered internally at [^)]*\)\.?", "", m).strip()
        if not m or "kernel not used because" in m or "has been runtime disabled" in m:
            continue
        m = one_line(m, 200)
        if m not in out:
            out.append(m)
    return out


def round_sizes(repeats, rounds):
    """Repeats per round when `repeats` are spread over `rounds` rounds: as even as can be, the first
    rounds one more (bench/runner.ts `roundSizes` is the same split)."""
    return [repeats // rounds + (1 if r < repeats % rounds else 0) for r in range(rounds)]


def cell_rounds(repeats):
    """The timed rounds of a cell whose backends (or whose two sides) take turns: INTERLEAVE_ROUNDS
    rounds, fewer when there are fewer repeats, none of them empty. bench/runner.ts `timedRounds` is
    the same, so that ours and a begin/round/end client agree round for round at equal repeats."""
    return round_sizes(repeats, min(INTERLEAVE_ROUNDS, repeats))


def error_row(cell, backend, message, mask):
    return {"id": cell["id"], "backend": backend, "msMedian": None, "msMin": None, "msMax": None,
            "peakBytes": None, "mask": mask, "error": message}


# ------------------------------------------------------------------------------------------------
# Everything below needs torch; it is imported in main() only after the request has been checked.

def environment(torch):
    v = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    cudnn = None
    if v is not None:
        # cuDNN 9 encodes major*10000 + minor*100 + patch; cuDNN 8 major*1000 + minor*100 + patch.
        cudnn = ("%d.%d.%d" % (v // 10000, (v % 10000) // 100, v % 100) if v >= 10000
                 else "%d.%d.%d" % (v // 1000, (v % 1000) // 100, v % 100))
    major, minor = torch.cuda.get_device_capability()
    driver = None
    try:
        r = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, timeout=20,
                           universal_newlines=True)
        if r.returncode == 0 and r.stdout.strip():
            driver = r.stdout.strip().splitlines()[0].strip()
    except (OSError, subprocess.SubprocessError):
        pass
    if driver is None:
        try:  # the CUDA version the driver supports, e.g. 13000 -> "CUDA 13.0 driver"
            d = int(torch._C._cuda_getDriverVersion())
            driver = "CUDA %d.%d driver" % (d // 1000, (d % 1000) // 10)
        except Exception:
            driver = None
    return {"torch": str(torch.__version__), "cuda": torch.version.cuda, "cudnn": cudnn,
            "device": torch.cuda.get_device_name(), "capability": "%d.%d" % (major, minor),
            "driver": driver, "python": platform.python_version()}


class Runner:
    def __init__(self, torch, req):
        self.torch = torch
        self.req = req
        from torch.nn.attention import SDPBackend, sdpa_kernel
        self.sdpa_kernel = sdpa_kernel
        self.sdp_backend = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                            "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}
        self.dtype = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}

    def make_set(self, cell, grad):
        """One input set, [B, S, H, D] contiguous, returned as [B, H, S, D] views."""
        torch = self.torch
        dt = self.dtype[cell["dtype"]]
        b, sq, sk, d = cell["batch"], cell["seqlenQ"], cell["seqlenK"], cell["headDim"]

        def rnd(s, h, leaf):
            t = torch.randn(b, s, h, d, device="cuda", dtype=dt)
            if leaf:
                t.requires_grad_(True)
            return t

        q, k, v = rnd(sq, cell["headsQ"], grad), rnd(sk, cell["headsKV"], grad), rnd(sk, cell["headsKV"], grad)
        s = {"q": q, "k": k, "v": v, "qt": q.transpose(1, 2), "kt": k.transpose(1, 2), "vt": v.transpose(1, 2)}
        if grad:
            s["dout"] = rnd(sq, cell["headsQ"], False).transpose(1, 2)
        return s

    def causal_plan(self, cell, backend, sample):
        """How the causal mask reaches SDPA: (kwargs for sdpa, mask label)."""
        if not cell["causal"]:
            return {}, "none"
        if cell["seqlenQ"] == cell["seqlenK"]:
            return {"is_causal": True}, "causal"
        from torch.nn.attention.bias import causal_lower_right
        kwargs = {"attn_mask": causal_lower_right(cell["seqlenQ"], cell["seqlenK"])}
        try:  # predict CausalBias._dispatch's choice (it asks the same questions, in this order)
            from torch.backends.cuda import SDPAParams, can_use_efficient_attention, can_use_flash_attention
            params = SDPAParams(sample["qt"], sample["kt"], sample["vt"], None, 0.0, False,
                                cell["headsQ"] != cell["headsKV"])
            with self.sdpa_kernel([self.sdp_backend[backend]]), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                fused = can_use_flash_attention(params) or can_use_efficient_attention(params)
            return kwargs, "lower_right_fused" if fused else "lower_right_materialized"
        except Exception as e:  # private helpers moved: run it anyway, say we could not tell
            log("torch_sdpa: cannot predict the lower-right causal dispatch (%s)" % one_line(e))
            return kwargs, "lower_right"

    def prepare(self, cell, backend):
        """One backend of a cell made ready to time: its input sets, its peak memory over one
        repeat, and its warm-up. Returns a Prepared, or an error row when the backend refuses."""
        torch = self.torch
        F = torch.nn.functional
        grad = cell["pass"] != "fwd"
        nsets = input_sets(cell)
        sets = [self.make_set(cell, grad) for _ in range(nsets)]
        kwargs, mask = self.causal_plan(cell, backend, sets[0])
        if (mask == "lower_right_materialized" and backend != "math"
                and not self.req["allowMaterializedMask"]):
            return error_row(cell, backend, "causal with seqlenQ != seqlenK: PyTorch SDPA's %s backend "
                             "has no bottom-right causal mask (only a dense mask, not comparable)" % backend, mask)
        if cell["headsQ"] != cell["headsKV"]:
            kwargs["enable_gqa"] = True

        def fwd(s):
            return F.scaled_dot_product_attention(s["qt"], s["kt"], s["vt"], **kwargs)

        if cell["pass"] == "fwd":
            def once(s):
                return fwd(s)
        elif cell["pass"] == "bwd":  # s["out"] (the saved forward) is made under sdpa_kernel below
            def once(s):
                return torch.autograd.grad(s["out"], (s["q"], s["k"], s["v"]), s["dout"], retain_graph=True)
        else:
            def once(s):
                return torch.autograd.grad(fwd(s), (s["q"], s["k"], s["v"]), s["dout"])

        selected = lambda: self.sdpa_kernel([self.sdp_backend[backend]])  # noqa: E731
        with selected():
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                try:
                    if cell["pass"] == "bwd":
                        for s in sets:  # the saved forward that each timed backward differentiates
                            s["out"] = fwd(s)
                    torch.cuda.synchronize()
                    # Peak above the inputs (and saved forwards), over one repeat.
                    torch.cuda.reset_peak_memory_stats()
                    base = torch.cuda.memory_allocated()
                    r = once(sets[0])
                    torch.cuda.synchronize()
                    peak = torch.cuda.max_memory_allocated() - base
                    del r
                except torch.cuda.OutOfMemoryError:
                    raise
                except RuntimeError as e:
                    # "No available kernel" alone says nothing; PyTorch warned why each kernel refused.
                    msg = one_line(e)
                    reasons = kernel_reasons(str(w.message) for w in caught)
                    if reasons and "No available kernel" in msg:
                        msg = one_line("%s (%s)" % (msg, "; ".join(reasons)), 400)
                    return error_row(cell, backend, msg, mask)
            start = time.perf_counter()
            for i in range(self.req["warmup"]):
                once(sets[i % nsets])
            torch.cuda.synchronize()
            batch = 1
            while (time.perf_counter() - start) * 1000.0 < self.req["warmupMs"]:
                for i in range(batch):
                    once(sets[i % nsets])
                torch.cuda.synchronize()
                batch *= 2
        return Prepared(torch, cell, backend, mask, int(peak), selected, once, sets)

    def open_cell(self, cell):
        """`cell` prepared on each backend of the request, one after another (inputs, memory run,
        warm-up: prepare), ready for its timed rounds: a CellTiming. A backend that refuses or fails
        keeps its error row; one cell must never end the run."""
        torch = self.torch
        c = CellTiming(torch, cell, self.req["backends"])
        for backend in self.req["backends"]:
            torch.manual_seed(self.req["seed"])
            try:
                r = self.prepare(cell, backend)
                if isinstance(r, dict):
                    c.results[backend] = r
                else:
                    c.timed.append(r)
            except torch.cuda.OutOfMemoryError:
                c.results[backend] = error_row(cell, backend, "out of memory", None)
            except Exception as e:
                c.results[backend] = error_row(cell, backend, "%s: %s" % (type(e).__name__, one_line(e)), None)
        return c

    def run(self):
        """Every cell x backend of the request. A cell's backends are prepared (open_cell), then
        their timed repeats take turns in the rounds of cell_rounds, so that the GPU's clocks
        drifting under sustained load weigh on every backend alike (bench/runner.ts times our rows
        the same way); a cell with one backend left to time takes its repeats in one round."""
        torch = self.torch
        cells, backends, reps = self.req["cells"], self.req["backends"], self.req["repeats"]
        total, done = len(cells) * len(backends), 0
        rows = []
        log("progress 0 %d" % total)
        for cell in cells:
            c = self.open_cell(cell)
            for n in (cell_rounds(reps) if len(c.timed) > 1 else [reps]):
                c.time_round(n)
            cell_rows = c.rows()
            del c
            for row in cell_rows:
                rows.append(row)
                done += 1
                log("progress %d %d" % (done, total))
            # The cell's inputs (and graphs) are gone now; hand their memory back. If the device
            # itself failed (a sticky CUDA error), no later cell can run: say so in their rows and
            # return what was measured.
            try:
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
            except Exception as e:
                lost = "CUDA failed after %s, no later cell could run: %s" % (cell["id"], one_line(e))
                log("torch_sdpa: " + lost)
                done_keys = {(r["id"], r["backend"]) for r in rows}
                rows += [error_row(c, b, lost, None) for c in cells for b in backends
                         if (c["id"], b) not in done_keys]
                return rows
        return rows


class CellTiming:
    """One cell on each backend of a request, from Runner.open_cell to its rows: the backends that
    refused or failed (their error rows, in `results`) and the Prepared ones (`timed`), which each
    time_round times in turn. Both the whole requests and the begin/round/end requests time cells
    through it."""

    def __init__(self, torch, cell, backends):
        self.torch, self.cell, self.backends = torch, cell, backends
        self.results = {}  # backend -> its row, once known (a failure, until rows())
        self.timed = []

    def time_round(self, n):
        """n timed repeats of each backend still timing, in the requested order; a backend that
        fails keeps its error row and sits out the later rounds."""
        torch = self.torch
        for t in self.timed:
            if t.backend in self.results:  # failed in an earlier round
                continue
            try:
                t.time(n)
            except torch.cuda.OutOfMemoryError:
                self.results[t.backend] = error_row(self.cell, t.backend, "out of memory", t.mask)
            except Exception as e:
                self.results[t.backend] = error_row(self.cell, t.backend,
                                                    "%s: %s" % (type(e).__name__, one_line(e)), t.mask)

    def rows(self):
        """One row per backend, in the requested order: its error, or its timings so far."""
        timed = {t.backend: t for t in self.timed}
        return [self.results[b] if b in self.results else timed[b].row() for b in self.backends]


class Prepared:
    """One backend of a cell, ready to time (Runner.prepare): time(n) adds n repeats, each between
    its own pair of CUDA events, rotating over the input sets; row() reports them."""

    def __init__(self, torch, cell, backend, mask, peak, selected, once, sets):
        self.torch, self.cell, self.backend, self.mask, self.peak = torch, cell, backend, mask, peak
        self.selected, self.once, self.sets = selected, once, sets
        self.times = []

    def time(self, n):
        torch = self.torch
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        with self.selected():
            torch.cuda.synchronize()
            for i in range(n):
                s = self.sets[(len(self.times) + i) % len(self.sets)]
                starts[i].record()
                r = self.once(s)
                ends[i].record()
                del r
            torch.cuda.synchronize()
        self.times += [a.elapsed_time(b) for a, b in zip(starts, ends)]

    def row(self):
        return {"id": self.cell["id"], "backend": self.backend, "msMedian": statistics.median(self.times),
                "msMin": min(self.times), "msMax": max(self.times), "peakBytes": self.peak, "mask": self.mask,
                "error": None}


def write_line(obj):
    """One JSON line on stdout, flushed: the bridge reads the answer as soon as the line ends."""
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def open_torch():
    """Imports torch and checks that it can run SDPA on CUDA; returns (torch, env). Exits 3 (with
    {"error": ...} on stdout) when it cannot."""
    try:
        import torch
    except ImportError:
        fail("PyTorch is not installed for %s" % sys.executable, EXIT_UNAVAILABLE)
    try:
        cuda = torch.cuda.is_available()
    except Exception as e:
        fail("CUDA is not available to PyTorch (%s)" % one_line(e), EXIT_UNAVAILABLE)
    if not cuda:
        fail("CUDA is not available to PyTorch %s (torch.version.cuda = %s)"
             % (torch.__version__, torch.version.cuda), EXIT_UNAVAILABLE)
    try:
        from torch.nn.attention import sdpa_kernel  # noqa: F401  (PyTorch >= 2.3)
    except ImportError:
        fail("PyTorch %s lacks torch.nn.attention.sdpa_kernel (needs >= 2.3)" % torch.__version__,
             EXIT_UNAVAILABLE)
    env = environment(torch)
    log("torch_sdpa: torch %s, CUDA %s, cuDNN %s on %s (sm %s)"
        % (env["torch"], env["cuda"], env["cudnn"], env["device"], env["capability"]))
    return torch, env


def free_memory(torch):
    """Hands what the last request allocated back to the driver, so that the bench's process can
    allocate for its next cell: collect cycles that may still hold tensors, then empty PyTorch's
    cache. A device that has failed cannot be cleaned; its next request's rows will say why."""
    gc.collect()
    try:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    except Exception as e:
        log("torch_sdpa: could not free the request's memory: %s" % one_line(e))


class OpenCell:
    """--serve's cell begun by a begin request and not yet ended: its CellTiming, the repeats of each
    round (cell_rounds), and the index the next round request must have."""

    def __init__(self, timing, sizes):
        self.timing, self.sizes, self.next = timing, sizes, 0


def out_of_order(kind, arg, open_cell):
    """Why request `kind` (with its argument) cannot come now, or None: cell requests go begin,
    round 0, 1, ... each once, end, and nothing else while a cell is open."""
    if open_cell is None:
        return "%s before begin (no cell is open)" % kind if kind in ("round", "end") else None
    cid = open_cell.timing.cell["id"]
    rounds = len(open_cell.sizes)
    if kind in ("cells", "begin"):
        expected = "round %d" % open_cell.next if open_cell.next < rounds else "end"
        return "%s while cell %r is open: expected %s" % ("a request" if kind == "cells" else "begin", cid, expected)
    if kind == "round" and open_cell.next == rounds:
        return "round: expected end (cell %r has %d rounds, all done) but got index %d" % (cid, rounds, arg)
    if kind == "round" and arg != open_cell.next:
        return "round: expected index %d (cell %r has %d rounds) but got %d" % (open_cell.next, cid, rounds, arg)
    if kind == "end" and open_cell.next < rounds:
        return "end: expected round %d first (cell %r: %d of %d rounds done)" % (open_cell.next, cid, open_cell.next, rounds)
    return None


def serve(torch, env):
    """--serve: the env line, then one answer line per request line, until EOF on stdin: {"rows": [...]}
    for a request, {"ready": ...}, {"ok": true} and {"rows": [...]} for a cell's begin, rounds and
    end. A malformed or out-of-order request ends the worker: {"error": "bad request: ..."} and
    exit 2, as one-shot."""
    write_line({"env": env})
    open_cell = None
    while True:
        line = sys.stdin.readline()
        if line == "":  # EOF: the bridge closed our stdin
            return 0
        if line.strip() == "":
            continue
        try:
            kind, arg = parse_serve_line(line)
            problem = out_of_order(kind, arg, open_cell)
            if problem is not None:
                raise RequestError(problem)
        except RequestError as e:
            fail("bad request: %s" % e, EXIT_BAD_REQUEST)
        if kind == "begin":
            sizes = cell_rounds(arg["repeats"])
            open_cell = OpenCell(Runner(torch, arg).open_cell(arg["cells"][0]), sizes)
            write_line({"ready": True, "rounds": sizes})
            continue
        if kind == "round":
            open_cell.timing.time_round(open_cell.sizes[arg])
            open_cell.next += 1
            write_line({"ok": True})
            continue
        if kind == "end":
            rows = open_cell.timing.rows()
            open_cell = None  # the cell's tensors: free_memory collects them
        else:
            rows = Runner(torch, arg).run()
        write_line({"rows": rows})
        del rows
        free_memory(torch)


def main(argv):
    if "--serve" in argv:
        if "--plan" in argv:
            fail("bad request: --plan is for the one-shot mode, not --serve", EXIT_BAD_REQUEST)
        torch, env = open_torch()
        return serve(torch, env)
    try:
        req = parse_request(sys.stdin.read())
    except RequestError as e:
        fail("bad request: %s" % e, EXIT_BAD_REQUEST)
    if "--plan" in argv:
        plan = [dict(c, workingSetBytes=working_set_bytes(c), inputSets=input_sets(c)) for c in req["cells"]]
        sys.stdout.write(json.dumps(dict(req, cells=plan)) + "\n")
        return 0
    torch, env = open_torch()
    rows = Runner(torch, req).run()
    write_line({"env": env, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
