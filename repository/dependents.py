"""Which ensembles use which models, for unloads that must take ensembles along.

Triton unloads every ensemble built on a model when that model is unloaded (an ensemble whose
step has nothing to run is not ready in any useful sense), and loads those ensembles again when
the model is loaded again, unless the ensemble itself was unloaded by request meanwhile.
"""

from __future__ import annotations

from protocol.proto.model_config_pb2 import ModelConfig
from repository.registry import ModelRegistry


def ensemble_members(config: ModelConfig | None) -> set[str]:
    """The models an ensemble's steps run (empty for a model that is not an ensemble)."""
    if config is None or config.platform != "ensemble":
        return set()
    return {step.model_name for step in config.ensemble_scheduling.step}


def ensembles_using(registry: ModelRegistry, name: str) -> list[str]:
    """Serving ensembles that run `name`, directly or through other ensembles, innermost first."""
    found: list[str] = []
    todo = [name]
    while todo:
        used = todo.pop()
        for model in registry.models.values():
            if model.name in found or model.name == name or not model.ready_versions():
                continue
            if used in ensemble_members(model.config):
                found.append(model.name)
                todo.append(model.name)
    return found


def ready_to_reload(registry: ModelRegistry, ensemble: str) -> bool:
    """Every member of an ensemble that was unloaded with one of them serves again."""
    record = registry.models.get(ensemble)
    members = ensemble_members(None if record is None else record.config)
    return bool(members) and all(
        registry.models.get(member) is not None and registry.models[member].ready_versions()
        for member in members
    )
