"""The command line shared by ``train.py`` and ``evaluate.py`` (:mod:`cli.commands`) and composed config files
(:mod:`cli.config`: a config's ``base:`` files apply before it)."""
from cli.commands import EvaluateCLI, ProjectCLI, TrainCLI, check_data_paths, interactive, with_default_config
from cli.config import ComposedConfigFile, config_files

__all__ = ["EvaluateCLI", "ProjectCLI", "TrainCLI", "check_data_paths", "interactive", "with_default_config",
           "ComposedConfigFile", "config_files"]
