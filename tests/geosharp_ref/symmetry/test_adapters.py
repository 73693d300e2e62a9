"""LoRA adapters (geosharp_ref/symmetry/adapters.py): a GL(r) pair per peft adapter, found by parameter name."""
import torch

from geosharp_ref.symmetry import check_binding, lora_bindings


def test_lora_adapters_are_found_and_are_a_symmetry(lora_bert):
    model, batch = lora_bert
    found = lora_bindings(model)
    assert len(found) == 4 and all(b.param_names[0].endswith("lora_B.default.weight") for b in found)
    params = {n: p.detach() for n, p in model.named_parameters()}
    for i, b in enumerate(found):
        R = b.random_element(params, scale=10.0, seed=i)
        assert R.shape == (2, 2)
        assert check_binding(model, b, batch, lambda o: o.logits, [R, 1e-2 * R]) < 1e-12


def test_lora_bindings_pair_every_a_with_its_b_in_parameter_order(lora_bert):
    """Expected pairs computed from the model's parameter names, independently of lora_bindings."""
    model, _ = lora_bert
    names = [n for n, _ in model.named_parameters()]
    expected = [(n.replace(".lora_A.", ".lora_B."), n) for n in names if ".lora_A." in n]
    found = lora_bindings(model, kernels="gl_inv")
    assert [b.param_names for b in found] == expected and all(b.kernels == "gl_inv" for b in found)
    assert [b.key for b in found] == [f"{b.rsplit('.lora_B', 1)[0]}:lora" for b, _ in expected]
    params = {n: p.detach() for n, p in model.named_parameters()}
    for b in found:
        G, H = b.extract(params)
        assert torch.equal(G[0], params[b.b_weight]) and torch.equal(H[0], params[b.a_weight].mT)
        R = b.random_element(params, scale=10.0, seed=1)
        moved = b.act(params, R)
        assert torch.allclose(moved[b.b_weight] @ moved[b.a_weight], params[b.b_weight] @ params[b.a_weight],
                              rtol=1e-10, atol=1e-12)
