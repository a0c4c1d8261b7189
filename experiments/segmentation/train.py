"""Train a segmentation model; by default FCN-ResNet18 on the embedded `shapes` dataset (CPU when no GPU).

    python experiments/segmentation/train.py                                  # shapes, all GPUs or CPU
    python experiments/segmentation/train.py --dataset ade20k --model encnet --backbone resnet50 --aux --se-loss
    torchrun --nproc_per_node 4 experiments/segmentation/train.py --dataset citys ...   # DDP

One process drives all local GPUs with DataParallelModel + DataParallelCriterion (ungathered outputs, exact
loss reduction, SyncBatchNorm across replicas); under torchrun each process owns one device (DDP).
"""
import os
import sys


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from option import parse_args  # noqa: E402

from assemble import build_run  # noqa: E402
from encoding.engine import evaluate, train_one_epoch  # noqa: E402
from encoding.utils import EpochLogger, format_table, is_main_process, save_checkpoint  # noqa: E402


def main(argv=None) -> dict:
    args = parse_args(argv)
    run = build_run(args)
    if is_main_process():
        print(run.describe())
    if args.eval:
        result = evaluate(run.model, run.val_loader, run.metric, run.input_device, run.amp_dtype)
        if is_main_process():
            print(format_table(result, run.class_names))
        return result
    best_pred, result = run.best_pred, {}
    with EpochLogger(run.output_dir) as log:
        for epoch in range(run.start_epoch, args.epochs):
            run.set_epoch(epoch)
            stats = train_one_epoch(run.model, run.criterion, run.optimizer, run.train_loader, run.scheduler, epoch,
                                    run.input_device, run.scaler, run.amp_dtype, args.clip_grad, best_pred)
            if not args.no_val:
                result = evaluate(run.model, run.val_loader, run.metric, run.input_device, run.amp_dtype)
                stats.update(pixAcc=result["pixAcc"], mIoU=result["mIoU"])
            new_pred = (stats.get("pixAcc", 0.0) + stats.get("mIoU", 0.0)) / 2
            is_best, best_pred = new_pred > best_pred, max(new_pred, best_pred)
            if is_main_process():
                log.write(epoch, **stats)
                save_checkpoint(run.checkpoint_state(epoch, best_pred, result), run.output_dir, is_best)
                print(f"epoch {epoch}: " + ", ".join(f"{k} {v:.4f}" for k, v in stats.items()))
    if result and is_main_process():
        print(format_table(result, run.class_names))
    return result


if __name__ == "__main__":
    main()
