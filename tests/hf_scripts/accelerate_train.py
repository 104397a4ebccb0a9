"""An Accelerate script as its users write one, knowing nothing of fsdp-jobs: a tiny Llama built from a config
(nothing is downloaded), Accelerate's FullyShardedDataParallelPlugin, `accelerator.save_state` every
--save-every steps into --output-dir/step_N (the layout of Accelerate's own examples) and
`accelerator.load_state` of the newest of them on start. It runs as `accelerate launch accelerate_train.py`
or `torchrun --nproc-per-node=2 accelerate_train.py`, or through fsdp-jobs:

    python -m fsdp_jobs script=tests/hf_scripts/accelerate_train.py 'script_args=[--max-steps,12]' nodes=2
"""

import argparse
import os
import re
import time

import torch
from accelerate import Accelerator, FullyShardedDataParallelPlugin
from transformers import LlamaConfig, LlamaForCausalLM

VOCAB, SEQ = 64, 16


def newest_step(out: str) -> int:
    """The step of the newest complete save (its random states are written last), 0 if none."""
    names = os.listdir(out) if os.path.isdir(out) else []
    return max((int(m.group(1)) for d in names if (m := re.fullmatch(r"step_(\d+)", d))
                and os.path.isfile(os.path.join(out, d, "random_states_0.pkl"))), default=0)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--output-dir", default="accelerate-out")
    parser.add_argument("--max-steps", type=int, default=12)
    parser.add_argument("--save-every", type=int, default=3)
    a = parser.parse_args()
    plugin = FullyShardedDataParallelPlugin(auto_wrap_policy="transformer_based_wrap",
                                            transformer_cls_names_to_wrap=["LlamaDecoderLayer"],
                                            state_dict_type="SHARDED_STATE_DICT")
    # on CPU Accelerate runs its MULTI_CPU type (DDP over gloo) and leaves the FSDP plugin unused
    accelerator = Accelerator(cpu=not torch.cuda.is_available(), fsdp_plugin=plugin)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=SEQ,
                                         bos_token_id=0, eos_token_id=0))
    optim = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, optim = accelerator.prepare(model, optim)
    step = newest_step(a.output_dir)
    if step:
        accelerator.load_state(os.path.join(a.output_dir, f"step_{step}"))
    say = print if accelerator.is_main_process else (lambda *_, **__: None)
    say(f"accelerate: resuming from step_{step}" if step else "accelerate: starting at step 0", flush=True)
    while step < a.max_steps:
        gen = torch.Generator().manual_seed(step * 1000 + accelerator.process_index)  # resumes exactly
        ids = torch.randint(0, VOCAB, (4, SEQ), generator=gen).to(accelerator.device)
        loss = model(input_ids=ids, labels=ids).loss
        accelerator.backward(loss)
        optim.step()
        optim.zero_grad()
        step += 1
        say(f"accelerate: step {step} loss {loss.item():.4f}", flush=True)
        time.sleep(float(os.environ.get("ACCELERATE_TRAIN_SECONDS_PER_STEP", "0")))  # a test's window to kill a rank
        if step % a.save_every == 0 or step == a.max_steps:
            accelerator.save_state(os.path.join(a.output_dir, f"step_{step}"))
    accelerator.wait_for_everyone()
    accelerator.end_training()


if __name__ == "__main__":
    main()
