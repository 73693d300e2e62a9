"""What the tweets cost measurements (timing_buckets.py, timing_curvature.py) time on: no model of the population,
the pretrained all-MiniLM-L6-v2 with a fresh 3-class head (seeded 0) and the population's first sharpness batch
(the first 128 training tweets, max_length 64), one thread, warnings off."""
import warnings

import torch

from geosharp_ref.studies.population.tweets import TweetsRecipesTask
from geosharp_ref.symmetry import symmetry_map


def pretrained_and_first_batch():
    """``(split, model, batch, symmetry map)``; the model in eval mode."""
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    task = TweetsRecipesTask()
    split = task.load_split(task.data_spec(0))
    torch.manual_seed(0)
    model = task.build_model({}).eval()
    batch = ({k: v[:128] for k, v in split.pool.items()}, split.y_pool[:128])
    return split, model, batch, symmetry_map(model)
