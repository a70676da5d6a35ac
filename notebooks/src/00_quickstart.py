# %% title [markdown]
# # nbddp quickstart
#
# One `%%ddp` cell = one `torchrun` job: four ranked processes, each with the environment torchrun would give it.

# %% parameters tags=["parameters"]
world_size = 4

# %% load-ext
# %load_ext nbddp

# %% title-ddp
# %%ddp -n $world_size --timeout 60 --pull total
import os, torch, torch.distributed as dist
dist.init_process_group("gloo")          # env:// — nbddp set the variables, exactly as torchrun does
t = torch.ones(1) * dist.get_rank(); dist.all_reduce(t); total = t.item()
print(f"RANK={os.environ['RANK']} LOCAL_RANK={os.environ['LOCAL_RANK']} WORLD_SIZE={os.environ['WORLD_SIZE']} sum={total}")
dist.destroy_process_group()

# %% title-code
expected = float(sum(range(world_size)))
assert _ddp.ok and total == [expected] * world_size, (total, _ddp.summary())   # --pull total: one value per rank
print(_ddp.summary())
