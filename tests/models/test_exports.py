"""`vitkit.models` exports every registered family's model class and config class."""

import vitkit.models
from vitkit.models.registry import families


def test_every_family_is_exported():
    exported = {getattr(vitkit.models, name) for name in vitkit.models.__all__}
    for fam in families():
        assert fam.model_cls in exported and fam.config_cls in exported, fam.name
