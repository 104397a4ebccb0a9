"""A Hugging Face Trainer script as its users write one, knowing nothing of fsdp-jobs: a tiny GPT-2 built
from a config (nothing is downloaded), `fsdp="full_shard auto_wrap"`, a checkpoint every --save-steps steps
(the Trainer's checkpoint-N folders in --output-dir), and a resume from the newest of them when there is one.
It runs as `torchrun --nproc-per-node=2 hf_trainer_train.py --max-steps 12`, or through fsdp-jobs:

    python -m fsdp_jobs script=tests/hf_scripts/hf_trainer_train.py 'script_args=[--max-steps,12]' nodes=2
"""

import argparse
import os
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments
from transformers.trainer_utils import get_last_checkpoint


class Tokens(torch.utils.data.Dataset):
    """Random token sequences, the same on every rank and every run (the Trainer's sampler splits them)."""

    def __init__(self, n: int, seq: int, vocab: int) -> None:
        self.ids = torch.randint(0, vocab, (n, seq), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class Pace(TrainerCallback):
    """HF_TRAIN_SECONDS_PER_STEP: a test's window to kill a rank mid-run."""

    def on_step_end(self, args, state, control, **kwargs):
        time.sleep(float(os.environ.get("HF_TRAIN_SECONDS_PER_STEP", "0")))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--output-dir", default="hf-out")
    parser.add_argument("--max-steps", type=int, default=12)
    parser.add_argument("--save-steps", type=int, default=3)
    a = parser.parse_args()
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=2, bos_token_id=0,
                                       eos_token_id=0))
    args = TrainingArguments(
        output_dir=a.output_dir, max_steps=a.max_steps, save_steps=a.save_steps, logging_steps=1,
        per_device_train_batch_size=4, learning_rate=1e-3, seed=0, report_to=[], dataloader_num_workers=0,
        disable_tqdm=True,
        # on CPU: Accelerate's MULTI_CPU (DDP over gloo; without use_cpu it sees no distributed job), which leaves
        # the fsdp settings unused; on GPUs they shard
        use_cpu=not torch.cuda.is_available(),
        fsdp="full_shard auto_wrap", fsdp_config={"transformer_layer_cls_to_wrap": ["GPT2Block"]})
    last = get_last_checkpoint(a.output_dir) if os.path.isdir(a.output_dir) else None
    if args.process_index == 0:
        print(f"hf trainer: resuming from {os.path.basename(last)}" if last else "hf trainer: starting at step 0",
              flush=True)
    trainer = Trainer(model=model, args=args, train_dataset=Tokens(256, 16, 64), callbacks=[Pace()])
    trainer.train(resume_from_checkpoint=last)
    if args.process_index == 0:
        print(f"hf trainer: done at step {trainer.state.global_step}", flush=True)


if __name__ == "__main__":
    main()
