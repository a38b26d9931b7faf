"""``recover``: jaxcc programs run again after one of them failed."""

from jaxcc._src import compat


def recover() -> None:
  """Let the next jaxcc program of this thread run after one failed (raised JaxRuntimeError).

  On jax 0.10 jaxcc's collectives run in program order through a token that
  each program takes and returns. A failed program's token carries its
  error, so every later jaxcc program would fail with it without running;
  ``recover`` drops that token, and the next program starts a fresh order.
  On jax >= 0.11 the order is each program's own (no token between
  programs) and there is nothing to drop. Every process that
  goes on after the failure calls it (each one's program failed too: a rank
  that fails tells the others). A connection that the failure closed stays
  closed until one side connects again (``tcp_bootstrap.reconnect``); the
  collectives over it fail at once, naming the process.
  """
  compat.reset_program_order()
