"""The engines the executor layer (``dispatch``) chooses among; its module docstring says what
each one is."""

from __future__ import annotations

import enum


class Engine(enum.Enum):
  XLA = "xla"
  LOCAL = "local"
  INPROCESS = "inprocess"
  TCP = "tcp"
  NCCL = "nccl"
  BORDER = "border"
  TWIN = "twin"
