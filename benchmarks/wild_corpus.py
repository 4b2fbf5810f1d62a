"""The default (current-kernel) rules on model code from outside the transformers corpus.

Libraries from outside transformers are fetched once with `pip download --no-deps` at pinned
versions into .cache/wild/ (set ADOPTER_WILD_DIR to move it), their model folders are unpacked,
scanned with the default rules, and the findings are scored against hand-made labels
(benchmarks/wild_labels.tsv; its header says how they were made). The packages come in two sets
scored separately as well as together: `wild1`, the first nine (protein, vision, vision-language,
speech, language), and `wild2`, fourteen more labelled later without looking at the tool's output
(video, diffusion, medical imaging, multimodal, graph, point cloud, music, detection, weather,
protein structure, time series), and `wild3`, nine libraries held out and labelled the same way before
the tool ran on them (speech: espnet; feature matching: kornia; video: pytorchvideo; music: demucs;
NLP: allennlp; dialogue: parlai; vision pretraining: mmpretrain; text-to-image: dalle-pytorch;
LLM fine-tuning: torchtune), and `wild4`, five more held out the same way (vision: torchvision;
tabular: pytorch-widedeep; speech separation: asteroid; NLP: stanza; time series: tsai), and `wild5`, six
more held out the same way (audio: torchaudio; graph: torch-geometric; time series: neuralforecast; recommender
systems: recbole; CTR prediction: deepctr-torch; genomics: enformer-pytorch), and `wild6`, six more held out the
same way (speech synthesis: coqui-tts; speech recognition: funasr; LM interpretability: transformer-lens; molecular
property prediction: unimol-tools; tabular: rtdl-revisiting-models; music generation: audiocraft), and `wild7`, eleven
more held out the same way (sequence modelling: fairseq; segmentation: mmsegmentation; multimodal: torchmultimodal;
tabular: pytorch-tabular; self-supervised vision: lightly; audio and music generation: audiolm-pytorch,
musiclm-pytorch; vision-language: flamingo-pytorch, CoCa-pytorch; memory-augmented LM: memorizing-transformers-pytorch;
linear attention: performer-pytorch), and `wild8`, six more held out the same way (windowed attention: local-attention;
LSH attention: reformer-pytorch; machine translation: OpenNMT-py, sockeye; audio generation: stable-audio-tools;
annotated paper implementations: a subset of labml-nn's transformer, normalization and optimizer modules), and `wild9`, six
more held out the same way (segmentation: segmentation-models-pytorch; text-to-image diffusion: DALLE2-pytorch;
contrastive vision-language: x-clip; tabular: tab-transformer-pytorch; vocoder: vocos; retrieval-augmented LM:
RETRO-pytorch).

    python benchmarks/wild_corpus.py              # score table, disagreements, compile/idempotence
    python benchmarks/wild_corpus.py --set wild2  # one set only
    python benchmarks/wild_corpus.py --sites      # also every applied finding

A label row names one site: package, path inside the unpacked package, class or function, the line
of the first statement of the pattern, the rule, and whether a correct tool should rewrite (or
guard) it (`fire`) or leave it alone (`no`). A finding matches a label of its rule and file when
the label's line lies within the finding's matched lines (two lines of slack either side).
Findings that are applied but have no `fire` label count as false positives, whether a `no` label
names them or not; `fire` labels without an applied finding are misses.
"""

from __future__ import annotations

import argparse
import csv
import fnmatch
import os
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script: import the checkout's engine
    sys.path.insert(0, str(ROOT))

from benchmarks.corpus import cache_lock  # noqa: E402

CACHE = Path(os.environ.get("ADOPTER_WILD_DIR", ROOT / ".cache" / "wild"))
LABELS = ROOT / "benchmarks" / "wild_labels.tsv"
SLACK = 2  # lines of slack around a finding's matched lines when pairing it with a label


@dataclass(frozen=True)
class Package:
    name: str  # as labels name it
    dist: str  # the pip distribution
    version: str
    domain: str
    include: tuple[str, ...]  # globs over paths inside the archive (after any sdist top folder)
    set: str = "wild1"  # which labelled set the package belongs to


PACKAGES: tuple[Package, ...] = (
    Package("fair-esm", "fair-esm", "2.0.0", "protein", ("esm/*.py", "esm/**/*.py")),
    Package("open_clip", "open_clip_torch", "3.3.0", "vision-language", ("open_clip/*.py",)),
    Package("whisper", "openai-whisper", "20250625", "speech", ("whisper/*.py",)),
    Package("speechbrain", "speechbrain", "1.1.2", "speech",
            ("speechbrain/nnet/*.py", "speechbrain/nnet/**/*.py", "speechbrain/lobes/models/transformer/*.py")),
    Package("x-transformers", "x-transformers", "2.31.10", "language", ("x_transformers/*.py",)),
    Package("vit-pytorch", "vit-pytorch", "1.26.14", "vision", ("vit_pytorch/*.py",)),
    Package("segment-anything", "segment-anything", "1.0", "vision", ("segment_anything/*.py", "segment_anything/**/*.py")),
    Package("timm", "timm", "1.0.31", "vision",
            ("timm/layers/*.py",) + tuple(f"timm/models/{m}.py" for m in (
                "vision_transformer", "swin_transformer", "beit", "eva", "cait", "xcit", "levit", "twins",
                "crossvit", "volo", "convit", "nest"))),
    Package("diffusers", "diffusers", "0.42.1", "vision (diffusion)",
            tuple(f"diffusers/models/{m}.py" for m in (
                "attention", "attention_processor", "activations", "normalization", "embeddings"))),
    # wild2: labelled by reading the code, by what a correct rewrite could do, before any scan
    Package("timesformer-pytorch", "timesformer-pytorch", "0.4.1", "video", ("timesformer_pytorch/*.py",), "wild2"),
    Package("video-diffusion-pytorch", "video-diffusion-pytorch", "0.7.0", "video (diffusion)",
            ("video_diffusion_pytorch/*.py",), "wild2"),
    Package("imagen-pytorch", "imagen-pytorch", "2.1.0", "image/video diffusion",
            ("imagen_pytorch/imagen_pytorch.py", "imagen_pytorch/imagen_video.py"), "wild2"),
    Package("denoising-diffusion-pytorch", "denoising-diffusion-pytorch", "2.3.4", "diffusion",
            tuple(f"denoising_diffusion_pytorch/{m}.py" for m in (
                "attend", "denoising_diffusion_pytorch", "denoising_diffusion_pytorch_1d", "classifier_free_guidance",
                "guided_diffusion", "simple_diffusion", "learned_gaussian_diffusion",
                "weighted_objective_gaussian_diffusion")), "wild2"),
    Package("k-diffusion", "k-diffusion", "0.1.1.post1", "diffusion", ("k_diffusion/models/*.py", "k_diffusion/layers.py"),
            "wild2"),
    Package("perceiver-pytorch", "perceiver-pytorch", "0.11.0", "multimodal", ("perceiver_pytorch/*.py",), "wild2"),
    Package("monai", "monai", "1.6.1", "medical imaging",
            tuple(f"monai/networks/{m}.py" for m in (
                "blocks/selfattention", "blocks/crossattention", "blocks/cablock", "nets/navit", "nets/swin_unetr",
                "nets/transchex", "nets/vista3d", "nets/milmodel")), "wild2"),
    Package("graph-transformer-pytorch", "graph-transformer-pytorch", "0.1.1", "graph",
            ("graph_transformer_pytorch/*.py",), "wild2"),
    Package("point-transformer-pytorch", "point-transformer-pytorch", "0.1.5", "point cloud",
            ("point_transformer_pytorch/*.py",), "wild2"),
    Package("bs-roformer", "bs-roformer", "1.2.4", "music source separation", ("bs_roformer/*.py",), "wild2"),
    Package("ultralytics", "ultralytics", "8.4.190", "detection", (
        "ultralytics/nn/modules/block.py", "ultralytics/nn/modules/transformer.py",
        "ultralytics/models/sam/modules/tiny_encoder.py", "ultralytics/models/sam/modules/transformer.py",
        "ultralytics/models/sam/modules/blocks.py"), "wild2"),
    Package("microsoft-aurora", "microsoft-aurora", "2.0.1", "weather", ("aurora/model/*.py",), "wild2"),
    Package("boltz", "boltz", "2.2.1", "protein structure",
            tuple(f"boltz/model/layers/{m}.py" for m in (
                "attention", "attentionv2", "pair_averaging", "triangular_attention/primitives")), "wild2"),
    Package("pytorch-forecasting", "pytorch-forecasting", "1.8.0", "time series", (
        "pytorch_forecasting/layers/_attention/_full_attention.py", "pytorch_forecasting/models/timexer/sub_modules.py",
        "pytorch_forecasting/models/samformer/_samformer_v2.py",
        "pytorch_forecasting/models/temporal_fusion_transformer/sub_modules.py"), "wild2"),
    # wild3: held out, labelled by reading the code before the tool ran on it
    Package("espnet", "espnet", "202511", "speech", (
        "espnet/nets/pytorch_backend/transformer/attention.py", "espnet/nets/pytorch_backend/transformer/dynamic_conv.py",
        "espnet/nets/pytorch_backend/transformer/optimizer.py", "espnet/nets/pytorch_backend/conformer/*.py",
        "espnet2/asr/encoder/beats_encoder.py", "espnet2/asr/layers/fastformer.py", "espnet2/asr/state_spaces/attention.py",
        "espnet2/asr_transducer/encoder/modules/attention.py", "espnet2/asr_transducer/decoder/blocks/mega.py",
        "espnet2/asr_transducer/normalization.py", "espnet2/enh/layers/swin_transformer.py", "espnet2/enh/layers/uses.py",
        "espnet2/enh/layers/tcn.py", "espnet2/enh/separator/tfgridnet*_separator.py"), "wild3"),
    Package("kornia", "kornia", "0.9.0", "vision (feature matching)", tuple(f"kornia/{m}.py" for m in (
        "feature/loftr/loftr_module/*", "feature/loftr/utils/coarse_matching", "feature/loftr/utils/fine_matching",
        "feature/lightglue", "feature/dedode/transformer/layers/*", "models/vit", "models/vit_mobile", "models/tiny_vit",
        "models/common", "models/sam/architecture/*", "models/efficient_vit/nn/*", "models/qwen25/vision",
        "models/paligemma/modeling_paligemma", "models/siglip2/attention", "models/kimi_vl/moonvit",
        "models/rt_detr/architecture/rtdetr_head", "models/dexined")), "wild3"),
    Package("pytorchvideo", "pytorchvideo", "0.1.5", "video",
            ("pytorchvideo/layers/*.py", "pytorchvideo/models/vision_transformers.py"), "wild3"),
    Package("demucs", "demucs", "4.1.0", "music source separation",
            tuple(f"demucs/{m}.py" for m in ("demucs", "hdemucs", "htdemucs", "transformer", "train")), "wild3"),
    # wild3 (B): labelled by reading the code, by what a correct rewrite could do, before the tool ran on it
    Package("allennlp", "allennlp", "2.10.1", "NLP", (
        "allennlp/modules/transformer/*.py", "allennlp/modules/attention/*.py", "allennlp/modules/matrix_attention/*.py",
        "allennlp/modules/seq2seq_encoders/*.py", "allennlp/modules/layer_norm.py", "allennlp/modules/masked_layer_norm.py",
        "allennlp/modules/scalar_mix.py", "allennlp/nn/activations.py"), "wild3"),
    Package("parlai", "parlai", "1.7.2", "dialogue", (
        "parlai/agents/transformer/modules/*.py", "parlai/agents/seq2seq/modules.py", "parlai/agents/memnn/modules.py",
        "projects/personality_captions/transresnet/modules.py",
        "projects/image_chat/transresnet_multimodal/transresnet_multimodal.py"), "wild3"),
    Package("mmpretrain", "mmpretrain", "1.2.0", "vision (pretraining)",
            ("mmpretrain/models/utils/attention.py", "mmpretrain/models/utils/norm.py",
             "mmpretrain/models/utils/__init__.py")  # which re-exports the backbones' bases
            + tuple(f"mmpretrain/models/backbones/{m}.py" for m in (
                "davit", "efficientformer", "hivit", "levit", "mixmim", "mvit", "twins", "vit_eva02", "vit_sam", "xcit",
                "hornet", "resnest"))
            + tuple(f"mmpretrain/models/multimodal/{m}.py" for m in (
                "flamingo/modules", "chinese_clip/bert", "ofa/ofa_modules", "blip/language_model", "ram/bert",
                "blip2/modeling_opt")), "wild3"),
    Package("dalle-pytorch", "dalle-pytorch", "1.6.6", "text-to-image",
            ("dalle_pytorch/attention.py", "dalle_pytorch/transformer.py", "dalle_pytorch/dalle_pytorch.py"), "wild3"),
    Package("torchtune", "torchtune", "0.6.1", "LLM fine-tuning",
            tuple(f"torchtune/modules/{m}.py" for m in (
                "attention", "attention_utils", "layer_norm", "rms_norm", "transformer", "feed_forward",
                "vision_transformer", "_export/attention"))
            + tuple(f"torchtune/models/{m}.py" for m in (
                "gemma/rms_norm", "gemma2/_attention", "t5/_encoder", "clip/_text_encoder")), "wild3"),
    # wild4: held out, labelled by reading the code, by what a correct rewrite could do, before the tool ran on it
    Package("torchvision", "torchvision", "0.20.1", "vision", tuple(f"torchvision/{m}.py" for m in (
        "models/swin_transformer", "models/maxvit", "models/video/swin_transformer", "models/video/mvit",
        "ops/misc")), "wild4"),
    Package("pytorch-widedeep", "pytorch-widedeep", "1.6.5", "tabular",
            tuple(f"pytorch_widedeep/{m}.py" for m in (
                "models/tabular/transformers/_attention_layers", "models/tabular/mlp/_attention_layers",
                "models/rec/din", "training/_base_trainer", "training/_base_bayesian_trainer",
                "self_supervised_training/_base_contrastive_denoising_trainer",
                "self_supervised_training/_base_encoder_decoder_trainer")), "wild4"),
    Package("asteroid", "asteroid", "0.7.0", "speech separation",
            ("asteroid/masknn/norms.py", "asteroid/masknn/attention.py", "asteroid/masknn/activations.py"), "wild4"),
    Package("stanza", "stanza", "1.10.1", "NLP (parsing)", tuple(f"stanza/models/{m}.py" for m in (
        "constituency/partitioned_transformer", "constituency/label_attention", "constituency/transformer_tree_stack",
        "common/relative_global_attn", "common/seq2seq_modules", "common/utils", "coref/model",
        "coref/word_encoder")), "wild4"),
    Package("tsai", "tsai", "0.4.0", "time series", tuple(f"tsai/models/{m}.py" for m in (
        "TST", "PatchTST", "TabTransformer", "TSPerceiver", "TabFusionTransformer", "RNNAttention", "RNNAttentionPlus",
        "ConvTranPlus", "layers")), "wild4"),
    # wild5: held out, labelled by reading the code, by what a correct rewrite could do, before the tool ran on it
    Package("torchaudio", "torchaudio", "2.5.1", "speech/audio", (
        "torchaudio/models/*.py", "torchaudio/models/wav2vec2/*.py", "torchaudio/models/squim/*.py",
        "torchaudio/prototype/models/rnnt.py"), "wild5"),
    Package("torch-geometric", "torch-geometric", "2.8.1", "graph", ("torch_geometric/nn/attention/*.py",) + tuple(
        f"torch_geometric/nn/{m}.py" for m in (
            "norm/layer_norm", "norm/graph_norm", "norm/pair_norm", "conv/dna_conv", "conv/transformer_conv",
            "dense/dense_gat_conv")), "wild5"),
    Package("neuralforecast", "neuralforecast", "3.3.0", "time series",
            ("neuralforecast/common/_modules.py", "neuralforecast/common/_base_model.py") + tuple(
                f"neuralforecast/models/{m}.py" for m in (
                    "informer", "patchtst", "tft", "timellm", "autoformer", "fedformer", "stemgnn", "tsmixerx",
                    "itransformer")), "wild5"),
    Package("recbole", "recbole", "1.2.1", "recommender systems", ("recbole/model/layers.py", "recbole/trainer/trainer.py")
            + tuple(f"recbole/model/{m}.py" for m in (
                "sequential_recommender/fearec", "sequential_recommender/shan", "sequential_recommender/ksr",
                "sequential_recommender/core", "sequential_recommender/repeatnet",
                "knowledge_aware_recommender/ripplenet", "knowledge_aware_recommender/mcclk",
                "context_aware_recommender/fignn")), "wild5"),
    Package("deepctr-torch", "deepctr-torch", "0.3.0", "CTR prediction", (
        "deepctr_torch/layers/interaction.py", "deepctr_torch/layers/sequence.py", "deepctr_torch/models/basemodel.py"),
            "wild5"),
    Package("enformer-pytorch", "enformer-pytorch", "0.8.12", "genomics",
            ("enformer_pytorch/modeling_enformer.py", "enformer_pytorch/finetune.py"), "wild5"),
    # wild6: held out, labelled by reading the code, by what a correct rewrite could do, before the tool ran on it
    Package("coqui-tts", "coqui-tts", "0.28.0", "speech synthesis", tuple(f"TTS/{m}.py" for m in (
        "tts/layers/glow_tts/transformer", "tts/layers/tacotron/gst_layers", "tts/layers/tacotron/attentions",
        "tts/layers/generic/aligner", "tts/layers/delightful_tts/networks", "tts/layers/delightful_tts/conformer",
        "tts/layers/bark/model_fine", "tts/layers/bark/hubert/tokenizer",
        "tts/layers/tortoise/transformer", "tts/layers/tortoise/arch_utils", "tts/layers/tortoise/xtransformers",
        "tts/layers/tortoise/diffusion", "tts/layers/xtts/perceiver_encoder", "tts/layers/generic/normalization",
        "vc/layers/freevc/wavlm/modules")), "wild6"),
    Package("funasr", "funasr", "1.4.16", "speech recognition", tuple(f"funasr/models/{m}.py" for m in (
        "sanm/attention", "eend/encoder", "emotion2vec/modules", "qwen_audio/audio", "data2vec/utils",
        "transformer/layer_norm")), "wild6"),
    Package("transformer-lens", "transformer-lens", "4.3.0", "LM interpretability", tuple(
        f"transformer_lens/{m}.py" for m in (
            "model_bridge/sources/native/model", "model_bridge/generalized_components/attention",
            "model_bridge/generalized_components/joint_qkv_attention",
            "model_bridge/generalized_components/position_embeddings_attention",
            "model_bridge/generalized_components/normalization", "model_bridge/generalized_components/ssm_mixer",
            "utilities/activation_functions", "tools/training")), "wild6"),
    Package("unimol-tools", "unimol-tools", "0.1.6", "molecular property", (
        "unimol_tools/models/transformers.py", "unimol_tools/models/transformersv2.py", "unimol_tools/tasks/trainer.py"),
            "wild6"),
    Package("rtdl-revisiting-models", "rtdl-revisiting-models", "0.0.2", "tabular", ("rtdl_revisiting_models.py",),
            "wild6"),
    Package("audiocraft", "audiocraft", "1.3.0", "music generation",
            ("audiocraft/modules/transformer.py", "audiocraft/solvers/builders.py"), "wild6"),
    # wild7: held out, labelled by reading the code, by what a correct rewrite could do, before the tool ran on it
    Package("fairseq", "fairseq", "0.12.2", "sequence modelling", tuple(f"fairseq/{m}.py" for m in (
        "modules/multihead_attention", "modules/espnet_multihead_attention", "modules/downsampled_multihead_attention",
        "modules/kmeans_attention", "modules/gelu", "modules/location_attention", "modules/dynamic_convolution",
        "model_parallel/modules/multihead_attention", "models/lstm", "models/fconv", "optim/adam")), "wild7"),
    Package("mmsegmentation", "mmsegmentation", "1.2.2", "semantic segmentation", tuple(f"mmseg/models/{m}.py" for m in (
        "utils/__init__", "utils/self_attention_block", "utils/san_layers", "utils/encoding", "decode_heads/da_head",
        "decode_heads/dnl_head", "decode_heads/ocr_head", "decode_heads/ema_head", "decode_heads/psa_head",
        "backbones/twins", "backbones/beit", "backbones/swin", "backbones/vpd")), "wild7"),
    Package("torchmultimodal", "torchmultimodal-nightly", "2024.4.1", "multimodal", tuple(f"torchmultimodal/{m}.py" for m in (
        "modules/layers/attention", "modules/layers/normalizations", "models/masked_auto_encoder/swin_decoder",
        "models/mdetr/image_encoder", "diffusion_labs/modules/losses/vlb_loss", "modules/losses/reconstruction_loss")),
            "wild7"),
    Package("pytorch-tabular", "pytorch-tabular", "1.2.0", "tabular", tuple(f"pytorch_tabular/models/{m}.py" for m in (
        "common/layers/transformers", "base_model", "tab_transformer/tab_transformer", "ft_transformer/ft_transformer")),
            "wild7"),
    Package("lightly", "lightly", "1.6.0", "self-supervised vision", tuple(f"lightly/models/{m}.py" for m in (
        "modules/capi_predictor_timm", "modules/masked_causal_vision_transformer", "utils")), "wild7"),
    Package("audiolm-pytorch", "audiolm-pytorch", "2.4.0", "audio generation",
            ("audiolm_pytorch/attend.py", "audiolm_pytorch/audiolm_pytorch.py", "audiolm_pytorch/optimizer.py"), "wild7"),
    Package("musiclm-pytorch", "musiclm-pytorch", "0.2.8", "music generation",
            ("musiclm_pytorch/musiclm_pytorch.py", "musiclm_pytorch/trainer.py"), "wild7"),
    Package("flamingo-pytorch", "flamingo-pytorch", "0.1.2", "vision-language", ("flamingo_pytorch/*.py",), "wild7"),
    Package("CoCa-pytorch", "CoCa-pytorch", "0.1.0", "vision-language", ("coca_pytorch/*.py",), "wild7"),
    Package("memorizing-transformers-pytorch", "memorizing-transformers-pytorch", "0.4.1", "memory-augmented LM",
            ("memorizing_transformers_pytorch/memorizing_transformers_pytorch.py",), "wild7"),
    Package("performer-pytorch", "performer-pytorch", "1.1.4", "linear attention",
            ("performer_pytorch/performer_pytorch.py",), "wild7"),
    # wild8: held out, labelled by reading the code, by what a correct rewrite could do, before the tool ran on it
    Package("local-attention", "local-attention", "1.11.2", "windowed attention",
            ("local_attention/local_attention.py", "local_attention/transformer.py"), "wild8"),
    Package("reformer-pytorch", "reformer-pytorch", "1.4.4", "efficient attention (LSH)",
            ("reformer_pytorch/reformer_pytorch.py",), "wild8"),
    Package("OpenNMT-py", "OpenNMT-py", "3.5.1", "machine translation", tuple(f"onmt/{m}.py" for m in (
        "modules/multi_headed_attn", "modules/global_attention", "modules/conv_multi_step_attention", "modules/rmsnorm",
        "utils/optimizers")), "wild8"),
    Package("sockeye", "sockeye", "3.1.34", "machine translation",
            ("sockeye/layers.py", "sockeye/transformer.py", "sockeye/optimizers.py"), "wild8"),
    Package("stable-audio-tools", "stable-audio-tools", "0.0.19", "audio generation", tuple(
        f"stable_audio_tools/{m}.py" for m in (
            "models/transformer", "models/blocks", "models/adp", "training/diffusion", "training/utils")), "wild8"),
    Package("labml-nn", "labml-nn", "0.5.1", "annotated paper implementations", tuple(f"labml_nn/{m}.py" for m in (
        "transformers/mha", "transformers/alibi/__init__", "transformers/rope/__init__",
        "transformers/rope/value_pe/__init__", "transformers/xl/relative_mha", "transformers/compressive/__init__",
        "transformers/feedback/__init__", "transformers/retro/model", "transformers/aft/__init__",
        "diffusion/ddpm/unet", "diffusion/stable_diffusion/model/unet_attention", "neox/model",
        "normalization/layer_norm/__init__", "normalization/batch_norm/__init__", "normalization/group_norm/__init__",
        "normalization/instance_norm/__init__", "normalization/batch_channel_norm/__init__",
        "normalization/weight_standardization/__init__", "optimizers/configs", "helpers/optimizer")), "wild8"),
    # wild9: held out, labelled by reading the code, by what a correct rewrite could do, before the tool ran on it
    Package("segmentation-models-pytorch", "segmentation-models-pytorch", "0.6.0", "semantic segmentation", tuple(
        f"segmentation_models_pytorch/{m}.py" for m in (
            "encoders/mix_transformer", "decoders/manet/decoder", "decoders/upernet/decoder", "decoders/segformer/decoder",
            "decoders/dpt/decoder", "base/modules")), "wild9"),
    Package("DALLE2-pytorch", "DALLE2-pytorch", "1.15.6", "text-to-image diffusion",
            tuple(f"dalle2_pytorch/{m}.py" for m in ("dalle2_pytorch", "vqgan_vae", "optimizer")), "wild9"),
    Package("x-clip", "x-clip", "0.14.4", "contrastive vision-language", ("x_clip/*.py",), "wild9"),
    Package("tab-transformer-pytorch", "tab-transformer-pytorch", "0.6.1", "tabular", ("tab_transformer_pytorch/*.py",),
            "wild9"),
    Package("vocos", "vocos", "0.1.0", "neural vocoder",
            tuple(f"vocos/{m}.py" for m in ("experiment", "modules", "models", "heads", "discriminators")), "wild9"),
    Package("RETRO-pytorch", "RETRO-pytorch", "0.3.9", "retrieval-augmented language model",
            tuple(f"retro_pytorch/{m}.py" for m in ("retro_pytorch", "optimizer", "training")), "wild9"),
)
SETS: tuple[str, ...] = tuple(dict.fromkeys(p.set for p in PACKAGES))


def set_labels(labels: list[Label], set_name: str) -> list[Label]:
    """The labels of one set's packages."""
    names = {p.name for p in PACKAGES if p.set == set_name}
    return [lb for lb in labels if lb.package in names]


def set_sites(sites: list[Site], set_name: str) -> list[Site]:
    names = {p.name for p in PACKAGES if p.set == set_name}
    return [s for s in sites if s.package in names]


def _archive(pkg: Package) -> Path:
    wheel_dir = CACHE / "wheels"
    stem = pkg.dist.replace("-", "_")

    def found() -> list[Path]:
        prefix = f"{stem}-{pkg.version}".lower()
        return sorted(p for p in wheel_dir.glob("*")
                      if p.name.lower().startswith(prefix)
                      and (p.suffix == ".whl" or p.name.endswith(".tar.gz")))

    if found():
        return found()[0]
    wheel_dir.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-build-isolation",
         "--dest", str(wheel_dir), f"{pkg.dist}=={pkg.version}"],
        check=True,
    )
    if not found():
        raise RuntimeError(f"pip did not produce {pkg.dist} {pkg.version} in {wheel_dir}")
    return found()[0]


def _wanted(name: str, pkg: Package) -> bool:
    return any(fnmatch.fnmatch(name, pat) for pat in pkg.include)


def unpack(pkg: Package) -> Path:
    """Unpack the selected files of one package (keeping its layout); return that folder. The
    folder's marker names the selection it holds: a changed selection is unpacked again."""
    dest = CACHE / f"{pkg.dist}-{pkg.version}"
    marker = dest / ".complete"
    selection = "ok\n" + "".join(f"{pattern}\n" for pattern in pkg.include)
    if marker.exists() and marker.read_text() == selection:
        return dest
    with cache_lock(CACHE):
        if not (marker.exists() and marker.read_text() == selection):  # not unpacked meanwhile
            _unpack(pkg, dest, selection)
    return dest


def _unpack(pkg: Package, dest: Path, selection: str) -> None:
    marker = dest / ".complete"
    if dest.exists():
        shutil.rmtree(dest)
    archive = _archive(pkg)
    if archive.suffix == ".whl":
        with zipfile.ZipFile(archive) as zf:
            for name in zf.namelist():
                if _wanted(name, pkg):
                    zf.extract(name, dest)
    else:  # an sdist: members sit under one top folder
        with tarfile.open(archive) as tf:
            for member in tf.getmembers():
                inner = member.name.split("/", 1)[1] if "/" in member.name else ""
                if member.isfile() and _wanted(inner, pkg):
                    target = dest / inner
                    target.parent.mkdir(parents=True, exist_ok=True)
                    source = tf.extractfile(member)
                    assert source is not None
                    target.write_bytes(source.read())
    marker.write_text(selection)


def package_files(pkg: Package) -> list[tuple[str, Path]]:
    base = unpack(pkg)
    return sorted((p.relative_to(base).as_posix(), p) for p in base.rglob("*.py"))


@dataclass(frozen=True)
class Label:
    package: str
    path: str
    scope: str
    line: int
    rule: str
    expected: str  # "fire" or "no"
    reason: str


def read_labels(path: Path = LABELS) -> list[Label]:
    rows = []
    with path.open() as fh:
        lines = [ln for ln in fh if ln.strip() and not ln.startswith("#")]
    for row in csv.reader(lines, delimiter="\t"):
        if row[0] == "package":
            continue
        package, rel, scope, line, rule, expected, reason = (row + [""] * 7)[:7]
        if expected not in ("fire", "no"):
            raise ValueError(f"label {row}: expected must be fire or no")
        rows.append(Label(package, rel, scope, int(line), rule, expected, reason))
    return rows


@dataclass
class Site:
    """One finding of the scan, as the score sees it."""

    package: str
    path: str
    rule: str
    status: str
    line: int
    end_line: int
    lines: frozenset[int]
    scope: str
    reason: str | None

    @property
    def applied(self) -> bool:
        return self.status in ("rewritten", "guarded")


@dataclass
class PackageScan:
    package: Package
    sites: list[Site] = field(default_factory=list)
    rewritten: dict[str, tuple[str, str, str]] = field(default_factory=dict)  # rel -> (module, old, new)
    files: int = 0
    seconds: float = 0.0


def _module(rel: str) -> str:
    return rel[:-3].replace("/", ".").removesuffix(".__init__")


def scan_package(pkg: Package, rules) -> PackageScan:
    from engine.extract.package import PackageIndex
    from engine.scan import scan_source

    out = PackageScan(pkg)
    start = time.perf_counter()
    files = package_files(pkg)
    index = PackageIndex(unpack(pkg), [rel for rel, _ in files], _module)  # bases from the package's other files
    for rel, path in files:
        text = path.read_text(encoding="utf-8")
        out.files += 1
        if "torch" not in text:
            continue
        findings, new_text = scan_source(text, rules, rel, _module(rel), index)
        for f in findings:
            lines = {f.line, f.end_line} | {p.line for p in f.locations if p.file in (rel, "", None)}
            out.sites.append(Site(pkg.name, rel, f.rule_id, f.status, f.line, f.end_line, frozenset(lines),
                                  f"{f.cls}.{f.method}" if f.cls else f.method, f.reason))
        if new_text != text:
            out.rewritten[rel] = (_module(rel), text, new_text)
    out.seconds = time.perf_counter() - start
    return out


def _near(site: Site, label: Label) -> bool:
    if site.path != label.path or site.rule != label.rule:
        return False
    lo, hi = min(site.lines), max(site.lines)
    return lo - SLACK <= label.line <= hi + SLACK


def _below(site: Site, label: Label, labels: list[Label]) -> bool:
    """`site` starts below `label` in the same function with no other label of the file between: a
    finding that leaves the first statements of a labelled pattern in place (the scale of q kept
    where the code reassigns q before the product) is that label's site."""
    if site.path != label.path or site.rule != label.rule or site.scope != label.scope:
        return False
    lo = min(site.lines)
    return label.line < lo and not any(other.path == label.path and label.line < other.line < lo
                                       for other in labels if other is not label)


@dataclass
class Score:
    tp: list[tuple[Label, Site]] = field(default_factory=list)
    fp: list[tuple[Site, Label | None]] = field(default_factory=list)  # the `no` label it hit, if any
    fn: list[tuple[Label, Site | None]] = field(default_factory=list)  # a near-miss finding there, if any
    tn: list[Label] = field(default_factory=list)

    @property
    def precision(self) -> float:
        return len(self.tp) / (len(self.tp) + len(self.fp)) if self.tp or self.fp else 1.0

    @property
    def recall(self) -> float:
        return len(self.tp) / (len(self.tp) + len(self.fn)) if self.tp or self.fn else 1.0


def score(labels: list[Label], sites: list[Site]) -> Score:
    """Pair applied findings with labels one to one (nearest line first)."""
    result = Score()
    applied = [s for s in sites if s.applied]
    used: set[int] = set()
    for label in sorted(labels, key=lambda lb: (lb.expected != "fire", lb.package, lb.path, lb.line)):
        candidates = [(abs(s.line - label.line), i) for i, s in enumerate(applied)
                      if i not in used and s.package == label.package and _near(s, label)]
        if candidates:
            _, i = min(candidates)
            used.add(i)
            if label.expected == "fire":
                result.tp.append((label, applied[i]))
            else:
                result.fp.append((applied[i], label))
        elif label.expected == "fire":
            near = [s for s in sites if not s.applied and s.package == label.package and _near(s, label)]
            result.fn.append((label, near[0] if near else None))
        else:
            result.tn.append(label)
    # second pass: a `fire` label left unpaired takes the applied finding just below it in its function
    for label, near in list(result.fn):
        candidates = [(s.line, i) for i, s in enumerate(applied) if i not in used and s.package == label.package
                      and _below(s, label, labels)]
        if candidates:
            _, i = min(candidates)
            used.add(i)
            result.fn.remove((label, near))
            result.tp.append((label, applied[i]))
    for i, s in enumerate(applied):
        if i not in used:
            result.fp.append((s, None))
    return result


def check_rewrites(scans: list[PackageScan], rules) -> list[str]:
    """Every rewritten file compiles and a second scan of it applies nothing; return the problems."""
    from engine.scan import scan_source

    problems = []
    for scan in scans:
        for rel, (module, _old, new) in sorted(scan.rewritten.items()):
            where = f"{scan.package.name}/{rel}"
            try:
                compile(new, where, "exec")
            except SyntaxError as exc:
                problems.append(f"{where}: the rewritten file does not compile: {exc}")
                continue
            findings, again = scan_source(new, rules, rel, module)
            if again != new:
                problems.append(f"{where}: a second scan rewrote the output again")
            still = [f for f in findings if f.status in ("rewritten", "guarded")]
            if still:
                problems.append(f"{where}: a second scan still applies {len(still)} finding(s), "
                                f"first {still[0].rule_id} at line {still[0].line}")
    return problems


def run(rules_spec: str = "default", packages: tuple[Package, ...] = PACKAGES):
    from engine.scan import select_rules

    rules = select_rules(rules_spec)
    scans = [scan_package(pkg, rules) for pkg in packages]
    return rules, scans


def _fmt(name: str, s: Score) -> str:
    return (f"{name:<28} {len(s.tp):>4} {len(s.fp):>4} {len(s.fn):>4} {len(s.tn):>4}"
            f"   {s.precision:6.3f} {s.recall:6.3f}")


def report(labels: list[Label], scans: list[PackageScan], problems: list[str], show_sites: bool = False) -> Score:
    sites = [s for scan in scans for s in scan.sites]
    total = score(labels, sites)
    header = f"{'':<28} {'TP':>4} {'FP':>4} {'FN':>4} {'TN':>4}   {'P':>6} {'R':>6}"
    print("packages:")
    for scan in scans:
        p = scan.package
        spec = f"{p.dist}=={p.version}"
        print(f"  {p.name:<27} {p.set:<6} {spec:<40} {p.domain:<24} {scan.files:>4} files "
              f"{len(scan.rewritten):>3} rewritten  {scan.seconds:5.1f}s")
    print(f"\nlabels: {sum(lb.expected == 'fire' for lb in labels)} fire, {sum(lb.expected == 'no' for lb in labels)} no\n")
    print("per rule\n" + header)
    for rule in sorted({lb.rule for lb in labels} | {s.rule for s in sites if s.applied}):
        print(_fmt(rule, score([lb for lb in labels if lb.rule == rule], [s for s in sites if s.rule == rule])))
    print("\nper package\n" + header)
    for scan in scans:
        name = scan.package.name
        print(_fmt(name, score([lb for lb in labels if lb.package == name], scan.sites)))
    print("\nper set\n" + header)
    for set_name in SETS:
        if any(scan.package.set == set_name for scan in scans):
            print(_fmt(set_name, score(set_labels(labels, set_name), set_sites(sites, set_name))))
    print(_fmt("all", total))
    print("\ndisagreements:")
    for site, label in sorted(total.fp, key=lambda x: (x[0].package, x[0].path, x[0].line)):
        why = f"labelled no: {label.reason}" if label else "no label"
        print(f"  FP {site.rule:<14} {site.package}/{site.path}:{site.line} {site.scope} [{site.status}] ({why})")
    for label, near in sorted(total.fn, key=lambda x: (x[0].package, x[0].path, x[0].line)):
        why = f"near-miss: {near.reason}" if near else "not found"
        print(f"  FN {label.rule:<14} {label.package}/{label.path}:{label.line} {label.scope} ({why}; label: {label.reason})")
    if show_sites:
        print("\napplied findings:")
        for s in sorted(sites, key=lambda s: (s.package, s.path, s.line)):
            if s.applied:
                print(f"  {s.rule:<14} {s.package}/{s.path}:{s.line}-{s.end_line} {s.scope} [{s.status}]")
    print("\nrewrites compile and are idempotent:", "yes" if not problems else "NO")
    for problem in problems:
        print("  " + problem)
    return total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rules", default="default")
    parser.add_argument("--sites", action="store_true", help="list every applied finding")
    parser.add_argument("--near", action="store_true", help="list every near-miss finding")
    parser.add_argument("--package", action="append", help="only these packages (label names)")
    parser.add_argument("--set", action="append", choices=SETS, help="only the packages of these sets")
    args = parser.parse_args(argv)
    packages = tuple(p for p in PACKAGES if (not args.package or p.name in args.package)
                     and (not args.set or p.set in args.set))
    rules, scans = run(args.rules, packages)
    labels = [lb for lb in read_labels() if lb.package in {p.name for p in packages}] if LABELS.exists() else []
    problems = check_rewrites(scans, rules)
    report(labels, scans, problems, args.sites)
    if args.near:
        print("\nnear-misses:")
        for scan in scans:
            for s in scan.sites:
                if not s.applied:
                    print(f"  {s.rule:<14} {s.package}/{s.path}:{s.line} {s.scope} ({s.reason})")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
