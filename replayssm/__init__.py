"""ReplaySSM: cache SSM inputs, not state. Triton kernels, float64 oracles and caches for Mamba-2 and GDN."""

from replayssm.geometry import GDN_MODELS, MAMBA2_MODELS, GDNGeometry, Mamba2Geometry, get_geometry

__all__ = ["GDN_MODELS", "MAMBA2_MODELS", "GDNGeometry", "Mamba2Geometry", "get_geometry"]
