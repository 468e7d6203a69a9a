"""The command line of ``train.py`` and ``evaluate.py``: one ``LightningCLI`` with this project's glue.

:class:`ProjectCLI` (shared):

* the entry point's default config when no ``--config`` is given (``-h``/``--help`` aside);
* composed configs: ``--config FILE`` applies the files ``FILE`` names under ``base:`` first (:mod:`cli.config`);
* W&B runs offline unless ``WANDB_MODE`` says otherwise; a ``WandbLogger`` without ``save_dir`` writes under
  ``trainer.default_root_dir``;
* the progress bar is shown in a terminal and hidden in CI (``CI`` set) or when stdout is not a TTY, unless
  ``trainer.enable_progress_bar`` is given;
* ``seed_everything`` defaults to 0; the resolved config is saved in the run folder (overwriting);
* called with ``args=None`` it reads ``sys.argv`` and writes the completed command line back, because DDP
  children re-run the same command line;
* no subcommands (``run=False``): the entry point calls ``trainer.fit``/``trainer.test`` itself.

:class:`TrainCLI` takes any LightningModule (``model.class_path``; a config that gives none gets
:class:`~lightning_modules.probe.LinearProbe`, so an image config lists only its keys) and adds ``--output``,
``--concepts``, ``--test``, the best-epoch checkpoint (``--checkpoint.*``: a ``ModelCheckpoint`` on ``val/loss``
that every training run has, so configs do not list it) and the mixed-precision default (``trainer.precision``
unset: ``bf16-mixed``, ``16-mixed`` without bf16 support, on a CUDA accelerator; ``32-true`` otherwise).
:class:`EvaluateCLI` adds ``--output_dir``, ``--overwrite``, ``--progress_every`` and ``--resume``, forces
``trainer.inference_mode=False`` (the attribution methods need autograd inside ``test_step``) and defaults
``trainer.default_root_dir`` to ``outputs``. ``--resume <run folder>`` reads the run's config from
``<run folder>/progress/config.yaml`` (no ``--config``) and refuses a command line that changes the evaluation
(only :data:`RESUME_MAY_CHANGE` may differ). A run folder is data, not code: its saved config may not switch on
a setting that runs code from files (:data:`CODE_SWITCHES`), name a class outside :data:`TRUSTED_CLASS_PATHS` nor
train with a config outside ``configs/`` unless the command line repeats that setting or passes
``--trust_run_config`` (:func:`untrusted_settings`).
"""
from __future__ import annotations

import argparse
import hashlib
import os
import sys
from pathlib import Path
from typing import Any, List, Optional, Sequence, Union

import pytorch_lightning as pl
from pytorch_lightning.cli import LightningCLI

from callbacks.base import EvaluationCallback
from callbacks.progress import DEFAULT_EVERY, ProgressError, resume_config
from cli.config import BASE_KEY, ComposedConfigFile, config_files
from lightning_modules.evaluation import AttributionEvaluationModule
from models.concepts import ConceptsConfig

ROOT = Path(__file__).resolve().parent.parent
TRAIN_CONFIG = ROOT / "configs" / "train" / "synthetic_vit.yaml"
EVALUATE_CONFIG = ROOT / "configs" / "evaluate" / "synthetic.yaml"


def interactive() -> bool:
    """Whether a person watches the output: stdout is a terminal and ``CI`` is not set."""
    return sys.stdout.isatty() and not os.environ.get("CI")


def with_default_config(args: Sequence[str], default: Optional[Path]) -> List[str]:
    """``args``, preceded by ``--config <default>`` when they give no config and ask for no help."""
    args = list(args)
    given = any(a in ("--config", "-c") or a.startswith("--config=") for a in args)
    if default is not None and not given and not {"-h", "--help"} & set(args):
        args = ["--config", str(default)] + args
    return args


def check_data_paths(datamodule: Any) -> None:
    """Exit with a clear message when the datamodule's data folder (``root``, ``data_dir``) or file (``path``)
    does not exist."""
    for attr, what in (("root", "data folder"), ("data_dir", "data folder"), ("path", "data file")):
        value = getattr(datamodule, attr, None)
        if isinstance(value, (str, os.PathLike)) and not Path(os.path.expanduser(str(value))).exists():
            raise SystemExit(f"error: {what} {str(value)!r} does not exist; pass it with --data.init_args.{attr} PATH")


def _config_model_class(value: str) -> Optional[bool]:
    """Whether the ``--config`` value (a file, with the files it builds on in the order they apply, or an inline
    YAML string) names the model's class where it first sets ``model``: ``None`` when it sets no ``model``."""
    import yaml

    path = Path(os.path.expanduser(value))
    try:
        sources = [f.read_text() for f in config_files(path)] if path.is_file() else [value]
    except (OSError, ValueError):
        return None  # the parser reports a bad config file
    for text in sources:
        try:
            content = yaml.safe_load(text)
        except yaml.YAMLError:
            continue
        model = content.get("model") if isinstance(content, dict) else None
        if model is not None:
            return isinstance(model, dict) and "class_path" in model
    return None


def names_model_class(args: Sequence[str]) -> bool:
    """Whether the first option of a command line that sets the model names its class: ``--model X`` or
    ``--model.class_path X`` (or ``=`` forms), or a ``--config`` whose ``model`` has a ``class_path``; not when a
    config's ``model`` without one, or a ``--model.<argument>`` option, comes first."""
    args = list(args)
    for i, arg in enumerate(args):
        option, eq, value = arg.partition("=")
        if option in ("--model", "--model.class_path"):
            return True
        if option.startswith("--model."):
            return False
        if option in ("--config", "-c"):
            named = _config_model_class(value if eq else (args[i + 1] if i + 1 < len(args) else ""))
            if named is not None:
                return named
    return False


def wandb_init_args(trainer: Any) -> List[Any]:
    """The ``init_args`` of every ``WandbLogger`` among the loggers of a trainer config."""
    logger = trainer.get("logger")
    return [item["init_args"] for item in (logger if isinstance(logger, list) else [logger])
            if hasattr(item, "get") and "WandbLogger" in str(item.get("class_path", ""))]


class ProjectCLI(LightningCLI):
    """``LightningCLI(model_class, any LightningDataModule)`` with the glue shared by the entry points."""

    #: the config applied when the command line gives none
    default_config: Optional[Path] = None
    #: ``trainer.default_root_dir`` when neither the config nor the command line gives one
    default_root_dir: Optional[str] = None

    def __init__(self, model_class: type, args: Optional[Sequence[str]] = None,
                 datamodule_class: type = pl.LightningDataModule, **kwargs: Any) -> None:
        os.environ.setdefault("WANDB_MODE", "offline")
        from_argv = args is None
        args = self.complete_args(with_default_config(sys.argv[1:] if from_argv else args, self.default_config))
        if from_argv:  # LightningCLI reads sys.argv itself; DDP children re-run this same command line
            sys.argv[1:] = args
        kwargs.setdefault("subclass_mode_data", True)
        kwargs.setdefault("save_config_kwargs", {"overwrite": True})
        kwargs.setdefault("seed_everything_default", 0)
        super().__init__(model_class, datamodule_class, run=False, args=None if from_argv else args, **kwargs)

    def complete_args(self, args: List[str]) -> List[str]:
        """The command line as parsed, from the one given (after the default config is added); as given here."""
        return args

    def init_parser(self, **kwargs: Any):
        kwargs.setdefault("dump_header", [f"pytorch_lightning=={pl.__version__}"])
        parser = self.parser_class(**kwargs)
        parser.add_argument("-c", "--config", action=ComposedConfigFile,
                            help="Path to a configuration file in json or yaml format (its 'base:' files apply first).")
        # the 'base:' key of config files, read by ComposedConfigFile; not an option of the run
        parser.add_argument(f"--{BASE_KEY}", type=Optional[Union[str, List[str]]], default=None,
                            help=argparse.SUPPRESS)
        return parser

    def before_instantiate_classes(self) -> None:
        self.config.pop(BASE_KEY, None)
        trainer = self.config["trainer"]
        if trainer.get("enable_progress_bar") is None:
            trainer["enable_progress_bar"] = interactive()
        if self.default_root_dir is not None and trainer.get("default_root_dir") in (None, ""):
            trainer["default_root_dir"] = self.default_root_dir
        root = trainer.get("default_root_dir") or os.getcwd()
        for init_args in wandb_init_args(trainer):
            if init_args.get("save_dir") in (None, ".", ""):
                init_args["save_dir"] = str(root)
            Path(init_args["save_dir"]).mkdir(parents=True, exist_ok=True)


class TrainCLI(ProjectCLI):
    """``train.py``'s command line: any LightningModule (default class
    :class:`~lightning_modules.probe.LinearProbe`; e.g. ``class_path:
    lightning_modules.text_classifier.TextClassifierModule``) and any datamodule."""

    default_config = TRAIN_CONFIG
    #: the model class of a config that names none (every image config)
    default_model_class = "lightning_modules.probe.LinearProbe"

    def __init__(self, args: Optional[Sequence[str]] = None, **kwargs: Any) -> None:
        kwargs.setdefault("subclass_mode_model", True)
        super().__init__(pl.LightningModule, args, **kwargs)

    def complete_args(self, args: List[str]) -> List[str]:
        """``--model.class_path <default_model_class>`` first unless the first option that sets the model names
        its class (:func:`names_model_class`). Not a parser default: jsonargparse would carry that class's default
        arguments (``lr``, ...) over to a class that a config names."""
        if names_model_class(args):
            return args
        return ["--model.class_path", self.default_model_class, *args]

    def add_arguments_to_parser(self, parser) -> None:
        parser.add_argument("--output", type=Optional[str], default=None,
                            help="where the trained classifier is exported: a timm classifier file (probes; default "
                                 "<default_root_dir>/classifier.pt) or a Hugging Face folder (text classifiers; "
                                 "default <default_root_dir>/classifier)")
        parser.add_argument("--concepts", type=Optional[ConceptsConfig], default=None,
                            help="also build concept heads of the trained classifier (CDAM concepts), saved next to it")
        parser.add_argument("--test", type=bool, default=False,
                            help="after training, also test the best weights on the datamodule's test split "
                                 "(metrics printed and stored with the export)")
        # the best epoch (lowest validation loss) is what train.py reloads and exports: every run keeps it
        from pytorch_lightning.callbacks import ModelCheckpoint

        parser.add_lightning_class_args(ModelCheckpoint, "checkpoint")
        parser.set_defaults({"checkpoint.monitor": "val/loss", "checkpoint.mode": "min", "checkpoint.save_top_k": 1,
                             "checkpoint.filename": "best-{epoch}"})

    def before_instantiate_classes(self) -> None:
        import torch

        super().before_instantiate_classes()
        trainer = self.config["trainer"]
        if trainer.get("precision") is None:
            accel = str(trainer.get("accelerator") or "auto")
            cuda = torch.cuda.is_available() and accel in ("auto", "gpu", "cuda")
            mixed = "bf16-mixed" if cuda and torch.cuda.is_bf16_supported() else "16-mixed"
            trainer["precision"] = mixed if cuda else "32-true"


class EvaluateCLI(ProjectCLI):
    """``evaluate.py``'s command line: an :class:`~lightning_modules.evaluation.AttributionEvaluationModule`
    and any datamodule."""

    default_config = EVALUATE_CONFIG
    default_root_dir = "outputs"

    def __init__(self, args: Optional[Sequence[str]] = None, **kwargs: Any) -> None:
        #: the run folder that ``--resume`` continues (``None``: a new run)
        self.resume_dir: Optional[Path] = None
        self.given_args = given = list(sys.argv[1:] if args is None else args)
        resume = _option_values(given, "--resume")
        if resume and resume[-1] not in (None, "", "null"):
            self.resume_dir = Path(os.path.expanduser(resume[-1]))
            try:
                saved = resume_config(self.resume_dir)
            except ProgressError as err:
                raise SystemExit(f"error: --resume: {err}") from None
            others = [c for c in _option_values(given, "--config", "-c") if Path(str(c)).resolve() != saved.resolve()]
            if others:
                raise SystemExit(f"error: --resume takes the run's config from {str(saved)!r}; drop --config "
                                 f"{others[0]} (the evaluation of a resumed run cannot change)")
            moved = [d for d in _option_values(given, "--output_dir")
                     if d is None or Path(os.path.expanduser(d)).resolve() != self.resume_dir.resolve()]
            if moved:
                raise SystemExit(f"error: a resumed run writes to its own folder {str(self.resume_dir)!r}; drop "
                                 f"--output_dir {moved[0]}")
            self.default_config = saved   # DDP children re-run the completed command line, --config included
        super().__init__(AttributionEvaluationModule, args, **kwargs)

    def add_arguments_to_parser(self, parser) -> None:
        parser.add_argument("--output_dir", type=Optional[str], default=None,
                            help="folder of metrics.json (default <trainer.default_root_dir>/evaluate/<date-time>)")
        parser.add_argument("--progress_every", type=int, default=DEFAULT_EVERY,
                            help="write each process's progress to <output_dir>/progress every N batches, so that "
                                 "--resume can continue a killed run (0: no checkpoints)")
        parser.add_argument("--progress_interval", type=float, default=180.0,
                            help="seconds between progress lines (printed when stdout is not a terminal: samples "
                                 "done, the current step, the time left)")
        parser.add_argument("--resume", type=Optional[str], default=None,
                            help="continue the killed run in this folder (its config, its finished samples)")
        parser.add_argument("--trust_run_config", action="store_true",
                            help="with --resume: accept the run folder's saved config even where it lets files run "
                                 "code (allow_pickle, trust_remote_code) or names classes outside this project")
        parser.add_argument("--overwrite", type=bool, default=False,
                            help="start a new run in an --output_dir that holds an earlier run's results or progress "
                                 "(replaced; other files are kept)")

    def before_instantiate_classes(self) -> None:
        self.config["trainer"]["inference_mode"] = False  # the methods need autograd inside test_step
        super().before_instantiate_classes()
        if self.resume_dir is not None:
            self.config["output_dir"] = str(self.resume_dir)
            saved = _plain(self.parser, self.parser.parse_args(["--config", str(self.default_config)]))
            if "--trust_run_config" not in self.given_args:
                self._check_trusted(saved)
            changed = _changed_keys(self.parser, self.config, saved)
            if changed:
                shown = "; ".join(f"{key}: {before!r} -> {after!r}" for key, before, after in changed[:5])
                raise SystemExit(f"error: --resume {self.resume_dir}: the command line changes the evaluation of "
                                 f"the run ({shown}); a resumed run keeps its config, only "
                                 f"{', '.join(RESUME_MAY_CHANGE)} may change")
        for init_args in wandb_init_args(self.config["trainer"]):
            group, tags = run_group_and_tags(self.config)
            if not init_args.get("group"):
                init_args["group"] = group
            if not init_args.get("tags"):
                init_args["tags"] = tags
            if self.resume_dir is not None and "resumed" not in init_args["tags"]:
                # a new W&B run in the killed run's group; it logs the whole run's results
                init_args["tags"] = list(init_args["tags"]) + ["resumed"]

    def _check_trusted(self, saved: dict) -> None:
        """Exit naming every setting of the resumed run's config ``saved`` that :func:`untrusted_settings` finds
        and the command line does not repeat (``--<key> <same value>``)."""
        def repeated(key: str, value: Any) -> bool:
            return any(_yaml_value(given) == value for given in _option_values(self.given_args, f"--{key}"))

        found = [(key, value) for key, value in untrusted_settings(saved) if not repeated(key, value)]
        if found:
            shown = "; ".join(f"{key}: {value!r}" for key, value in found)
            switch = next((f"--{k} {str(v).lower()}" for k, v in found if k.rsplit(".", 1)[-1] in CODE_SWITCHES), "")
            raise SystemExit(f"error: --resume {self.resume_dir}: the run folder's saved config {self.default_config} "
                             f"lets files run code (allow_pickle, trust_remote_code), names a class outside this "
                             f"project's packages and Lightning's loggers and callbacks, or trains with a config "
                             f"outside configs/ ({shown}). A run folder is data: accept "
                             f"{'a setting by repeating it on the command line (' + switch + ') or ' if switch else ''}"
                             f"the whole saved config with --trust_run_config")


#: settings that let a model or data file run code (pickles, a Hugging Face folder's Python); a resumed run's
#: saved config may not switch them on by itself
CODE_SWITCHES = ("allow_pickle", "trust_remote_code")
#: where the classes that a resumed run's saved config names may come from: this project's packages and
#: Lightning's loggers and callbacks
TRUSTED_CLASS_PATHS = tuple(f"{package}." for package in (
    "methods", "models", "evaluation", "datamodules", "lightning_modules", "callbacks", "cli", "comparison",
    "training")) + ("pytorch_lightning.loggers.", "pytorch_lightning.callbacks.", "lightning.pytorch.loggers.",
                    "lightning.pytorch.callbacks.")
#: trusted packages' classes that call what a config names (``LambdaCallback``'s hooks are import paths)
UNTRUSTED_CLASSES = ("LambdaCallback",)


def _entries(config: Any, prefix: str = "", lists: bool = True):
    """``(dotted key, value)`` of every mapping entry in ``config`` at any depth (with ``lists``, the entries of
    mappings inside lists too, as ``key[i].sub``)."""
    if isinstance(config, dict):
        for key, value in config.items():
            path = f"{prefix}.{key}" if prefix else str(key)
            yield path, value
            yield from _entries(value, path, lists)
    elif isinstance(config, list) and lists:
        for i, value in enumerate(config):
            yield from _entries(value, f"{prefix}[{i}]", lists)


def untrusted_settings(config: dict) -> List[tuple]:
    """``[(dotted key, value)]`` of the plain ``config`` that let files run code: a :data:`CODE_SWITCHES` key
    switched on, a ``class_path`` outside :data:`TRUSTED_CLASS_PATHS`, or a model spec that trains on first use
    (``trained:`` / ``synthetic:``, also after ``clip:``) with a config outside the project's ``configs/`` (a
    config is code), at any depth."""
    return [(key, value) for key, value in _entries(config)
            if (key.rsplit(".", 1)[-1] in CODE_SWITCHES and value)
            or (key.rsplit(".", 1)[-1] == "class_path" and (not str(value).startswith(TRUSTED_CLASS_PATHS)
                                                             or str(value).rsplit(".", 1)[-1] in UNTRUSTED_CLASSES))
            or (isinstance(value, str) and not _project_training_spec(value))]


def _project_training_spec(spec: str) -> bool:
    """Whether ``spec`` is no ``trained:``/``synthetic:`` spec, or one whose config files (``+``-joined; relative
    to the current directory, else the repository) all lie in the repository's ``configs/``."""
    body = spec[len("clip:"):] if spec.startswith("clip:") else spec
    prefix = next((p for p in ("trained:", "synthetic:") if body.startswith(p)), None)
    if prefix is None:
        return True
    configs = (ROOT / "configs").resolve()
    for part in body[len(prefix):].split("+"):
        path = Path(os.path.expanduser(part))
        path = path if path.is_absolute() or path.exists() else ROOT / path
        if configs not in path.resolve().parents:
            return False
    return True


def _yaml_value(text: Optional[str]) -> Any:
    import yaml

    try:
        return yaml.safe_load(text) if text is not None else None
    except yaml.YAMLError:
        return text


#: dotted config keys (and the keys below them) that ``--resume`` lets the command line change: where the run's
#: results and logs go and how progress is shown and saved, never what is evaluated
RESUME_MAY_CHANGE = ("output_dir", "resume", "trust_run_config", "overwrite", "progress_every", "progress_interval",
                     "trainer.enable_progress_bar", "trainer.logger")


def _option_values(args: Sequence[str], *names: str) -> List[Optional[str]]:
    """The values given to the options ``names`` in ``args`` (``--name value`` or ``--name=value``), in order."""
    values: List[Optional[str]] = []
    for i, arg in enumerate(args):
        for name in names:
            if arg == name:
                values.append(args[i + 1] if i + 1 < len(args) else None)
            elif arg.startswith(name + "="):
                values.append(arg.split("=", 1)[1])
    return values


def _flat(config: dict) -> dict:
    """``{dotted key: value}`` of the leaves of the mappings in ``config`` (a list is one value)."""
    return {key: value for key, value in _entries(config, lists=False) if not isinstance(value, dict)}


def _plain(parser, config) -> dict:
    """``config`` as the plain data that ``parser`` dumps."""
    import yaml

    return yaml.safe_load(parser.dump(config, skip_none=False, skip_validation=True)) or {}


def _changed_keys(parser, config, saved: dict) -> List[tuple]:
    """``[(dotted key, saved value, value now)]`` where ``config`` differs from ``saved`` (the resumed run's config
    file resolved by ``parser``, as plain data), :data:`RESUME_MAY_CHANGE` aside."""
    def may_change(key: str) -> bool:
        return any(key == k or key.startswith(k + ".") for k in RESUME_MAY_CHANGE)

    before, now = _flat(saved), _flat(_plain(parser, config))
    keys = sorted(k for k in set(before) | set(now) if not may_change(k) and before.get(k) != now.get(k))
    return [(key, before.get(key), now.get(key)) for key in keys]


def _name(value: Any) -> str:
    """A short name of a classifier or datamodule spec: the class name, the file stem or the model name."""
    text = str(value)
    last = text.rsplit(".", 1)[-1]
    if "." in text and not set("/:") & set(text) and last[:1].isupper():   # a class path
        return last.replace("DataModule", "")
    text = text.split(":", 1)[-1] if ":" in text.split("/", 1)[0] else text   # timm:<name>, hf:<name>, synthetic:...
    return Path(text).stem if text.endswith((".pt", ".pth", ".bin", ".safetensors", ".yaml")) else text


def run_group_and_tags(config: Any) -> tuple:
    """The W&B group (``<dataset>/<model>``) and tags (dataset, model, method set, and what each evaluation
    callback declares: :meth:`~callbacks.base.EvaluationCallback.wandb_tags`) of an evaluate run, from its resolved
    config; each tag ``<what>:<value>``, at most 64 characters (W&B's limit)."""
    data = config.get("data") or {}
    dataset = _name(data.get("class_path") if hasattr(data, "get") else data)
    model = config.get("model") or {}
    classifier = _name(model.get("classifier"))
    methods = model.get("methods")
    if isinstance(methods, str):
        methods = [methods]
    elif methods is not None and not isinstance(methods, (list, tuple, dict)):   # a Namespace of named methods
        methods = vars(methods)
    names = "all" if not methods else "+".join(sorted(methods))
    if len(names) > 55:   # W&B's 64 characters: the count and a digest of the names
        names = f"{len(methods)}-{hashlib.sha1(names.encode()).hexdigest()[:8]}"
    tags = [f"dataset:{dataset}", f"model:{classifier}", f"methods:{names}"]
    callbacks = config["trainer"].get("callbacks") or []
    tags += EvaluationCallback.declared_wandb_tags(callbacks if isinstance(callbacks, list) else [callbacks])
    return f"{dataset}/{classifier}"[:128], [tag[:64] for tag in tags]
