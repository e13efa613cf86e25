"""Command line: ``python -m kvdro solve --instance small --method exact --seed 0 --json``.

``solve`` builds one of the paper's instances (:func:`kvdro.joint.paper_instance`), solves it and
prints the decision (z, r, pi, delta) with the cost breakdown of (8a) from
:func:`kvdro.joint.evaluate` -- as JSON with ``--json``, else as a short report.

``--instance scaled --classes C --gpus J`` is chapter 6's family of any size
(:func:`kvdro.bcd.scaling.scaled_instance`, e.g. 100 classes x 1,024 GPUs); ``--time-limit`` bounds
its build as well as HiGHS (a size not built within it is refused, exit 2, naming it). ``--load``
is at most :data:`MAX_LOAD`. ``--json`` prints strict JSON (a non-finite number is null, named on stderr).

Methods: ``exact`` (the fastest proven formulation, :data:`kvdro.joint.exact.DEFAULT_FORMULATION`)
and ``mccormick`` (the same MILP in the textbook McCormick form: same optimum, much weaker relaxation; give it a ``--time-limit``); ``bcd``
(BCD-DRO, the paper's Algorithm 1, :func:`kvdro.bcd.solve_bcd`: blockwise optimal, not proven optimal; printed
with chapter 6's certificate, the LP relaxation's bound and how far above the optimum BCD can at most be).
Exit status: 0 on success, 1 if the solver fails (message on stderr), 2 on bad usage.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import signal
import sys
import threading

from kvdro._fd import fd1_redirected

METHODS = {"exact": "default", "mccormick": "mccormick", "bcd": "bcd"}  # "default": kvdro.joint.exact.DEFAULT_FORMULATION

#: The largest ``--load`` accepted. Measured on the small instance (seed 0): 1e2, 1e4 and 1e6 solve
#: to optimality; at 1e9 HiGHS calls the (feasible) MILP infeasible and at 1e15 cvxpy cannot unpack
#: its answer -- the rates times the costs leave the range HiGHS's tolerances can tell apart.
MAX_LOAD = 1e6


class _BuildTimeout(Exception):
    """The instance was not built within ``--time-limit`` (:func:`_deadline`)."""


@contextlib.contextmanager
def _deadline(seconds: float):
    """Raise :class:`_BuildTimeout` in the main thread if the block runs longer than ``seconds``
    (SIGALRM; a no-op where there is none, or off the main thread)."""
    if not hasattr(signal, "setitimer") or threading.current_thread() is not threading.main_thread():
        yield
        return

    def _alarm(signum, frame):
        raise _BuildTimeout

    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, float(seconds))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0.0)
        signal.signal(signal.SIGALRM, old)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kvdro", description="Robust KV-cache reservation: solve the joint problem (6)/(8).")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("solve", help="solve one of the paper's instances and print the cost breakdown")
    s.add_argument("--instance", choices=("small", "large", "scaled"), default="small",
                   help="instance family (default small; scaled needs --classes and --gpus)")
    s.add_argument("--classes", type=int, default=None, help="number of classes of a scaled instance")
    s.add_argument("--gpus", type=int, default=None, help="GPU budget J of a scaled instance")
    s.add_argument("--method", choices=sorted(METHODS), default="exact", help="solver / formulation (default exact)")
    s.add_argument("--seed", type=int, default=0, help="seed of the sample draw (default 0)")
    s.add_argument("--load", type=float, default=None, help="multiplier of the trace's arrival rates")
    s.add_argument("--serving", choices=("analytic", "calibrated"), default="analytic",
                   help="serving model: chapter 4's analytic one or the simulator-calibrated table (default analytic)")
    s.add_argument("--time-limit", type=float, default=60.0, help="HiGHS time limit in seconds (default 60)")
    s.add_argument("--json", action="store_true", help="print JSON instead of a report")
    from kvdro.sim.cli import add_parser as _add_simulate_parser  # ``simulate`` (kvdro.sim, chapter 7)

    _add_simulate_parser(sub)
    return p


def _report(instance, solution, ev) -> str:
    lines = [instance.describe(), f"method {solution.method}: {solution.status} in {solution.solve_time_s:.2f} s, "
             f"objective {solution.objective:.6g} per s (gap {solution.mip_gap:.2g})"]
    lines.append("configs: " + ", ".join(f"{cfg.config.name} x{int(n)}" for cfg, n in zip(instance.configs, solution.z)))
    for i, c in enumerate(instance.classes):
        route = ", ".join(
            f"{instance.configs[k].config.name} {solution.pi[i, k]:.3f}{' (prefix cached)' if solution.delta[i, k] else ''}"
            for k in range(instance.n_configs)
            if solution.pi[i, k] > 0
        )
        lines.append(
            f"  {c.name:<22} r = {solution.r[i]:8.1f} tokens (buffer {solution.r[i] - instance.input_tokens[i]:5.0f}); "
            f"rejected {solution.rejected[i]:.3f}; {route or 'not routed'}"
        )
    lines.append("cost per second: " + ", ".join(f"{k} {v:.6g}" for k, v in ev.terms.items()) + f"; total {ev.total:.6g}")
    return "\n".join(lines)


def _check_solve_args(args: argparse.Namespace) -> None:
    """ValueError naming the argument of ``solve`` that is wrong, with nothing imported but argparse's
    results: --classes/--gpus (only, and both, with ``--instance scaled``; each >= 1), --load > 0,
    --load <= :data:`MAX_LOAD`, --time-limit > 0 (the same rules as :func:`kvdro.bcd.scaling.scaled_instance`,
    :func:`kvdro.joint.paper_instance` and :func:`kvdro.joint.solve_exact`, which check them again)."""
    if args.instance == "scaled":
        if args.classes is None or args.gpus is None:
            raise ValueError("--classes and --gpus: both are needed with --instance scaled")
        for flag, name, value in (("--classes", "n_classes", args.classes), ("--gpus", "total_gpus", args.gpus)):
            if value < 1:
                raise ValueError(f"{flag}: {name} must be an integer >= 1, got {value}")
    elif args.classes is not None or args.gpus is not None:
        raise ValueError(f"--classes/--gpus: only with --instance scaled, not {args.instance!r}")
    if args.load is not None and not (math.isfinite(args.load) and args.load > 0):
        raise ValueError(f"--load: must be a positive multiplier of the arrival rates, got {args.load!r}")
    if args.load is not None and args.load > MAX_LOAD:
        raise ValueError(f"--load: {args.load:g} is beyond the {MAX_LOAD:g} at which the MILP is still solved reliably "
                         "(the rates times the costs leave the range of the solver's tolerances)")
    if not (math.isfinite(args.time_limit) and args.time_limit > 0):
        raise ValueError(f"--time-limit: must be a positive number of seconds, got {args.time_limit!r}")


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``kvdro`` console script."""
    args = _parser().parse_args(argv)
    if args.command == "simulate":
        from kvdro.sim.cli import run as _run_simulate

        return _run_simulate(args)
    if args.seed < 0:
        print(f"kvdro solve: --seed: must be a non-negative integer, got {args.seed}", file=sys.stderr)
        return 2
    try:  # a bad command line is refused before cvxpy, the traces or a solver is loaded
        _check_solve_args(args)
    except ValueError as exc:
        print(f"kvdro solve: {exc}", file=sys.stderr)
        return 2
    from kvdro.errors import SolverError
    from kvdro.joint import evaluate, paper_instance, solve_exact
    from kvdro.joint.objective import predict_serving
    from kvdro.joint.paper import DEFAULT_LOAD

    kwargs = {} if args.load is None else {"load": args.load}
    try:
        if args.instance == "scaled":  # chapter 6's family of any size (--classes, --gpus checked above)
            from kvdro.bcd.scaling import scaled_instance

            try:  # the build is bounded by --time-limit too (it grows with --classes: ~20 ms a class here)
                with _deadline(args.time_limit):
                    instance = scaled_instance(args.classes, args.gpus, args.seed, serving=args.serving, **kwargs)
            except _BuildTimeout:
                raise ValueError(f"--classes {args.classes} --gpus {args.gpus}: the instance was not built within "
                                 f"--time-limit {args.time_limit:g} s (the limit bounds the build as well as HiGHS); "
                                 "give fewer --classes or a larger --time-limit") from None
        else:
            instance = paper_instance(args.instance, args.seed, serving=args.serving, **kwargs)
        with fd1_redirected("stderr"):
            if args.method == "bcd":  # BCD-DRO, Algorithm 1 (kvdro.bcd); scored by the same evaluate
                from kvdro.bcd import solve_bcd

                solution = solve_bcd(instance, time_limit=args.time_limit)
                # chapter 6's certificate: the LP relaxation of the exact model bounds the optimum below
                from kvdro.joint import solve_milp

                relaxation = solve_milp(instance, relax=True)
            else:
                from kvdro.joint.exact import DEFAULT_FORMULATION

                form = DEFAULT_FORMULATION if METHODS[args.method] == "default" else METHODS[args.method]
                solution = solve_exact(instance, formulation=form, time_limit=args.time_limit)
    except (ValueError, FileNotFoundError) as exc:
        print(f"kvdro solve: {exc}", file=sys.stderr)
        return 2
    except SolverError as exc:
        print(f"kvdro solve: {exc}", file=sys.stderr)
        return 1
    ev = evaluate(instance, solution)
    # a lower bound on the optimum and how far above it the answer can at most be: BCD's from the LP
    # relaxation (chapter 6), the exact solver's from its own branch and bound
    certificate = None
    if args.method == "bcd":
        if relaxation.status == "optimal" and ev.feasible:
            bound = float(relaxation.objective)
            certificate = {"bound": bound, "source": "LP relaxation", "gap_at_most": (ev.total - bound) / abs(ev.total)}
    elif math.isfinite(solution.mip_gap) and math.isfinite(solution.objective):
        bound = solution.objective - solution.mip_gap * abs(solution.objective)
        certificate = {"bound": float(bound), "source": "branch and bound", "gap_at_most": float(solution.mip_gap)}
    if args.json:
        out = {
            "instance": {"name": instance.name, "size": args.instance, "seed": args.seed, "J": instance.total_gpus,
                         "classes": instance.n_classes,
                         "load": float(kwargs.get("load", DEFAULT_LOAD)), "serving": instance.serving},
            "solution": solution.to_dict(instance),
            "cost": ev.to_dict(),
            "predicted": predict_serving(instance, solution),
            "certificate": certificate,
        }
        from kvdro.sim.plan import instance_fingerprint  # `simulate --plan` checks it (issue 29)

        out["fingerprint"] = instance_fingerprint(instance, size=args.instance, seed=args.seed,
                                                  load=out["instance"]["load"])
        from kvdro._strict_json import dumps as strict_json

        print(strict_json(out, prog="kvdro solve", indent=2))
    else:
        print(_report(instance, solution, ev))
        if args.method == "bcd" and certificate is not None:
            print(f"certificate: LP-relaxation bound {certificate['bound']:.6g} per s, so BCD's answer is at most "
                  f"{certificate['gap_at_most']:.2%} above the optimum")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
