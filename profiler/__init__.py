"""memplan's profiler: per-stage costs of a model (the profile).

Only the schema is imported eagerly; the measuring code imports torch and is loaded on first use,
so that `import profiler` stays light for the planner and the service.
"""

from profiler.schema import SCHEMA_VERSION, LayerProfile, Profile, ProfileError, load_profile

__all__ = ["SCHEMA_VERSION", "LayerProfile", "Profile", "ProfileError", "load_profile"]
