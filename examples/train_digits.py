"""Train a small ViT on the digits that ship with vitkit, evaluate it, classify one image and draw its attention.

The library calls behind `vitkit train / eval / predict / attention`. Run with `python examples/train_digits.py`
(about a minute on two CPU cores for the 10 epochs here; `vitkit train` runs the full default schedule).
"""

import tempfile
from pathlib import Path

from vitkit import from_pretrained
from vitkit.data import load_builtin
from vitkit.infer import attention_overlay, evaluate_model_dir, inference_info, predict
from vitkit.train import TrainConfig, fit


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        result = fit(TrainConfig(out=str(out), epochs=10))  # the default small ViT on builtin:mnist5k
        print(f"best held-out accuracy {result.best_acc:.3f} after epoch {result.best_epoch}")

        evaluation, info = evaluate_model_dir(str(out / "final"))
        print(f"top-1 {evaluation.top1:.3f}, top-5 {evaluation.top5:.3f} on {evaluation.count} test digits")
        worst = min(range(len(info.classes)), key=lambda k: evaluation.per_class[k].item())
        print(f"hardest digit: {info.classes[worst]} ({evaluation.per_class[worst].item():.3f})")

        model = from_pretrained(out / "final")
        info = inference_info(model)  # its class names and normalisation, saved in its config.json
        _, test, _ = load_builtin("mnist5k")
        image = test.load(0)
        top = predict(model, info, [image], top_k=3)[0]
        print(f"test digit 0 (a {info.classes[test.labels[0]]}): " + ", ".join(f"{c} {p:.2f}" for c, p in top))

        picture = attention_overlay(model, image, info.mean, info.std, rollout=True)
        Path("runs").mkdir(exist_ok=True)
        picture.save("runs/digit_attention.png")
        print(f"attention rollout drawn over the digit: runs/digit_attention.png ({picture.size[0]}x{picture.size[1]})")


if __name__ == "__main__":
    main()
