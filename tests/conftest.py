"""Runs before any test module computes on jax: the CPU platform with 8 virtual devices."""

from jaxcc._src.devices import use_virtual_cpu_devices

use_virtual_cpu_devices(8)
