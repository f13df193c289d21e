"""The two tiers of the suite (issue 50): which tests are ``slow`` (the full suite only) and why.

``tests/conftest.py`` marks them at collection; ``pytest -m "not slow"`` is the fast tier.
"""

from __future__ import annotations

import inspect
import re

# The fast tier (``pytest -m "not slow"``, README "Development"): what a developer runs on every change. Every
# test below is marked ``slow`` and runs in the full suite only (the README's test command, ``.ci/run``):
# - a module that starts a Ray or subprocess cluster or an S3 server, or trains models (optimizer steps);
# - a test marked ``ray``, and every test that trains (listed in TRAINING, or found by TRAINS in its code);
# - the longest end-to-end checks (about 2 s or more each on 2 quiet cores: whole tokenizers' code points,
#   parity against transformers on every engine, child processes, forked loaders, tiny models' forwards),
#   named as ``test`` (every parameter) or ``test[id]`` (that parameter; the module's other parameters stay
#   fast, so that the fast tier still runs each check once).
# A name that no longer exists marks nothing: keep this list when a test is renamed (``pytest -m slow
# --collect-only -q`` lists what it marks).
SLOW_MODULES = {
    "test_cluster": "a simulated multi-node Ray cluster and an S3 server",
    "test_cluster_store": "an S3 server (moto) in a process of its own",
    "test_ray": "a local Ray cluster",
    "test_tune_run": "torchtune's `tune run` trains a model",
    "test_trainers": "Trainer, SFTTrainer and plain loops train models",
    "test_vision_trainer": "Trainer trains a tiny Qwen2-VL",
}
TRAINING = {
    "test_preference_dpo": {"test_three_training_steps_on_packed_pairs"},
    "test_trainer_checks": {"test_streaming_with_the_trainer", "test_collate_flash_takes_the_exported_rows"},
}
SLOW_TESTS = {
    "test_docs": {   # the README's code, run for real: a build and four CLI processes
        "test_readme_python_block_runs",
        "test_readme_shell_commands_run",
        "test_readme_shows_what_the_one_command_prints",
    },
    "test_agentic": {
        "test_ids_equal_on_every_trl_template",
    },
    "test_agentic_more": {
        "test_mistral_tekken_tool_template_ids_and_turn_masks",
        "test_mixture_hf_dataset_export_and_inspect_carry_tool_rows",
        "test_call_chat_template_kwargs_under_each_rows_own",
        "test_reasoning_kept_out_of_the_loss[qwen3]",
        "test_text_prompt_completion_equals_trl",
    },
    "test_bpe": {
        "test_every_code_point[qwen2.5]",
        "test_every_code_point_matches_hf",
    },
    "test_build": {
        "test_real_tokenizer_hit_and_misses_on_tokenizer_or_template_byte",
        "test_transformers_tokenizer_object_fingerprint",
        "test_warm_reopen_in_a_fresh_process_is_fast_and_lean",
    },
    "test_cli": {
        "test_pack_no_cache_and_options",
    },
    "test_encoder": {
        "test_a_process_that_builds_fastokens_at_once_builds_no_tiktoken",
        "test_assistant_mask_equals_transformers_generation_mask",
        "test_chunk_sink_equals_row_by_row[last]",
        "test_chunk_sink_equals_row_by_row[assistant]",
        "test_gpt2_style_byte_level_tokenizer",
        "test_hf_labels_from_span_edges_equal_the_offset_rule[assistant-qwen_dir]",
        "test_merges_out_of_rank_order_fall_back",
        "test_parity_on_generated_rows[qwen_dir-openai-openai_file-fastokens]",
        "test_parity_on_generated_rows[qwen_dir-sharegpt-sharegpt_file-fastokens]",
        "test_parity_on_generated_rows[llama3_dir-sharegpt-sharegpt_file-fastokens]",
        "test_parity_on_generated_rows[llama3_dir-sharegpt-sharegpt_file-tiktoken]",
        "test_parity_on_generated_rows[llama3_dir-openai-openai_file-fastokens]",
        "test_parity_on_generated_rows[llama3_dir-openai-openai_file-tiktoken]",
        "test_parity_on_hand_written_rows[qwen_dir-fastokens]",
        "test_parity_on_hand_written_rows[llama3_dir-fastokens]",
        "test_random_conversations_match_hf_tokenizers",
        "test_runs_mask_equals_marking_each_run",
        "test_special_token_text_in_content_becomes_the_token",
        "test_template_that_rewrites_reasoning",
        "test_transformers_object_is_accepted",
        "test_unsupported_tokenizer_falls_back",
        "test_warm_start_serves_with_tiktoken_until_fastokens_is_asked_for",
    },
    "test_exit": {
        "test_ctrl_c_mid_run_ray",
    },
    "test_first_run": {
        "test_kernels_still_run_where_numba_cannot_write_a_cache",
        "test_the_first_pack_plans_while_its_kernels_compile_apart_and_says_so",
    },
    "test_fork_files": {
        "test_a_killed_forked_worker_raises_and_leaves_nothing",
        "test_a_build_loads_its_packing_kernels_after_its_workers_fork[1-False]",
        "test_a_fork_while_the_hf_check_waits_for_its_reply_does_not_hang",
        "test_a_wrong_vecpack_bpe_fails_the_parity_check_and_hf_serves",
        "test_forked_workers_give_loky_workers_bytes[fastokens-inherited]",
        "test_short_rows_are_served_by_vecpacks_bpe_with_loky_workers_bytes",
        "test_workers_forked_after_the_driver_encoded_on_several_threads",
    },
    "test_golden": {
        "test_builds_give_their_golden_arrays_and_cache_keys[vision]",
    },
    "test_inputs_more": {
        "test_every_form_gives_the_plain_arrays[2]",
        "test_tokenizing_while_decompressing_gives_the_plain_arrays[1]",
    },
    "test_kernel_lock": {
        "test_two_processes_at_once_compile_a_kernel_once",
    },
    "test_kernels": {
        "test_kernels_without_jit_equal_compiled",
    },
    "test_lane": {
        "test_lane_equals_python_path_on_awkward_lines[assistant]",
        "test_lane_equals_python_path_on_awkward_lines[all]",
    },
    "test_latin": {
        "test_every_token_that_can_occur_is_kept",
    },
    "test_leakage": {
        "test_transformers_flex_attention_compiled",
    },
    "test_mix_build": {
        "test_a_mixture_saves_loads_and_reopens_from_its_cache_entry",
        "test_same_output_for_any_n_jobs_and_seeds",
        "test_three_styles_by_tokens_hit_the_shares_with_no_document_twice",
    },
    "test_mix_cli": {
        "test_pack_a_mixture_reports_it_and_stats_and_inspect_show_it",
    },
    "test_mix_stream": {
        "test_resume_is_exact_at_three_points[2]",
    },
    "test_one_render": {
        "test_marks_equal_probes_on_every_template",
    },
    "test_parity": {
        "test_an_unsupported_tokenizer_fails_before_anything_runs",
    },
    "test_pathological": {
        "test_pathological_texts_encode_like_apply_chat_template",
    },
    "test_preference_dpo": {
        "test_dpo_loss_and_gradients_equal_trl",
        "test_packed_logps_equal_unpacked",
        "test_prefix_sharing_logps_equal_unpacked[flex]",
        "test_three_training_steps_on_packed_pairs",
    },
    "test_preference_tokens": {
        "test_tokens_equal_trl_on_awkward_texts[llama3]",
        "test_tokens_equal_trl_on_generated_pairs_in_every_form",
    },
    "test_sp_engine": {
        "test_every_code_point_alone_and_in_context",
        "test_metaspace_that_never_prepends_is_encoded_exactly",
        "test_rows_are_byte_identical_on_every_engine[mistral]",
    },
    "test_streaming": {
        "test_a_stream_abandoned_mid_way_exits_cleanly",
        "test_resume_at_every_pack[split-0]",
        "test_resume_at_every_pack[truncate-None]",
        "test_resume_equals_uninterrupted[1-2]",
        "test_resume_equals_uninterrupted[2-2]",
        "test_seeded_order_is_the_same_for_any_n_jobs",
    },
    "test_streaming_start": {
        "test_a_failed_check_before_the_first_pack_restarts_on_hf",
        "test_a_failed_fastokens_check_hands_the_rest_to_hf",
        "test_a_sentencepiece_stream_is_checked",
        "test_a_verdict_is_remembered_on_disk",
        "test_every_engine_and_switch_gives_hf_packs[1-qwen_dir]",   # [7-llama3_dir] (a switch mid-stream) stays fast
        "test_every_engine_and_switch_gives_hf_packs[10000-qwen_dir]",
        "test_every_engine_and_switch_gives_hf_packs[0-llama3_dir]",
        "test_forked_loader_workers_check_for_themselves",
        "test_no_warning_and_clean_exit_when_abandoned_at_once",
        "test_tiktoken_only_and_fastokens_from_the_start",
    },
    "test_structure_policy": {
        "test_a_structure_compiles_at_its_nth_sighting[2]",
    },
    "test_template": {
        "test_llama3_trim_is_detected",
        "test_real_templates_shipped_with_trl[cohere]",
        "test_render_equals_transformers[llama3_dir-llama]",
    },
    "test_tokenize": {
        "test_strict_tiktoken_backend_raises_when_the_check_fails",
        "test_masking_options_nest",
        "test_a_failed_parity_check_reruns_everything_with_hf_tokenizers",
        "test_a_file_that_shrinks_after_the_call_measured_it_is_an_error_not_fewer_rows[0]",
        "test_a_new_encoder_has_the_hf_process_load_the_tokenizer_at_once",
        "test_bad_rows_with_the_real_encoder",
        "test_encoder_is_built_once_per_process",
        "test_every_call_checks_its_own_datasets_rows",
        "test_matches_apply_chat_template_through_the_pool",
        "test_n_jobs_4_is_byte_identical",
        "test_openai_style",
        "test_rows_that_passed_are_not_checked_again_in_the_process",
        "test_the_parity_check_sees_this_datasets_rows",
        "test_transformers_tokenizer_object",
    },
    "test_torchtune": {
        "test_qwen_encoder_matches_torchtune[sharegpt-False-None-None]",
        "test_ranks_build_once_and_share",
    },
    "test_trained_bits": {
        "test_bits_give_the_packs_int32_labels_gave_on_every_engine[tiktoken]",
        "test_bits_give_the_packs_int32_labels_gave_on_every_engine[tokenizers]",
    },
    "test_tt_packed": {
        "test_datasets_that_cannot_travel_are_packed_here",
    },
    "test_turns": {
        "test_documents_are_apply_chat_template_of_each_turn",
    },
    "test_vision": {
        "test_a_1d_rope_vlm_llava_packs_exactly_and_unrestarted_positions_leak",
        "test_every_document_of_a_packed_batch_equals_its_solo_forward",
        "test_ids_grids_and_pixels_equal_the_processor_on_every_row",
        "test_qwen3_vl_patches_of_16_pack_exactly",
    },
    "test_vision_build": {
        "test_packs_never_cut_an_image_and_carry_their_documents_pixels",
    },
    "test_vision_cache": {
        "test_a_build_that_skipped_rows_is_not_stored_so_a_fixed_image_is_seen",
        "test_a_second_build_encodes_nothing_and_edits_miss",
    },
    "test_vision_checks": {
        "test_check_batch_passes_collate_vision_and_refuses_leaking_positions",
    },
    "test_vision_dir": {
        "test_text_rows_with_a_checkpoint_directory_keep_the_text_route",
    },
    "test_vision_gemma3": {
        "test_gemma3_packs_exactly_with_image_blocks_and_a_causal_mask_leaks",
    },
}


# Modules that run on one xdist worker under ``pytest -n 2 --dist loadgroup`` (the README's test command), each
# family as one unit of work, so that what they build once per process is built once, not once per worker:
# - "ray": a Ray cluster or an S3 endpoint (a module fixture each), which two workers would start twice, two
#   Ray clusters sharing the 2 cores;
# - "vision": the processors, tiny models and transformers' vision modules their fixtures load;
# - the modules whose module fixtures or memos each of their tests reads: transformers' tokenizers and
#   reference ids, HF packs, a CLI run, TRL's DPO run and preparation, a trained sentencepiece model, tiny
#   models, 22k rows, vecpack's BPE tables of two tokenizers.
# The groups go first (xdist sends the largest first); the other tests, one unit each, fill both workers
# to the end (:func:`heavy_first`).
GROUPS = {
    **dict.fromkeys(["test_cluster", "test_cluster_inputs", "test_cluster_store", "test_ray"], "ray"),
    **dict.fromkeys(["test_vision", "test_vision_build", "test_vision_cache", "test_vision_checks", "test_vision_cli",
                     "test_vision_codec", "test_vision_dir", "test_vision_gemma3", "test_vision_trainer"], "vision"),
    **{m: m for m in ["test_encoder", "test_agentic", "test_streaming_start", "test_tokenize", "test_sp_engine",
                      "test_cli", "test_preference_dpo", "test_preference_tokens", "test_torchtune", "test_template",
                      "test_mix_stream", "test_leakage", "test_one_render", "test_bpe"]},
}


def group_of(nodeid: str) -> str:
    """The unit of work ``--dist loadgroup`` schedules a test as: its module's group in :data:`GROUPS`, or the
    test alone (its node id)."""
    stem = nodeid.split("::", 1)[0].rsplit("/", 1)[-1].removesuffix(".py")
    return GROUPS.get(stem, nodeid)


def scheduler_class():
    """``--dist loadgroup``'s scheduler with the groups of :func:`group_of`, and a crashed worker's replacement.

    pytest-xdist groups the tests marked ``xdist_group`` by a suffix it appends to their node ids in the
    workers (``nodeid@group``); pytest 9 builds a node id from its parts and drops the suffix, so a mark
    groups nothing there (the Ray and S3 modules, once marked "ray", ran on both workers, each starting its
    own cluster and server). This scheduler reads the module from the node id instead (a suffix, where one
    still arrives, is kept).

    A worker that dies (a segfault, the kernel's OOM killer) is replaced; xdist 3.8's loadgroup then stopped
    the whole run with ``INTERNALERROR KeyError: <WorkerController gwN>`` (pytest-xdist issues 1189 and
    1362: the dead worker's collection still counts, so the replacement is given work before it has
    collected) or hung (issue 1323: units already run are queued again). Here a worker that died with tests
    left has its collection forgotten, only the tests it had not run are queued again, and the one it died in
    is reported (by xdist) as crashed, not run a second time."""
    from xdist.scheduler import LoadGroupScheduling

    class Groups(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            scope = super()._split_scope(nodeid)
            return scope if scope != nodeid else group_of(nodeid)

        def remove_node(self, node):
            workload = self.assigned_work.pop(node)
            left = {scope: unit for scope, unit in workload.items() if not all(unit.values())}
            if not left:   # (a worker that finished: its collection still counts, or the run never ends)
                return None
            self.registered_collections.pop(node, None)
            crashed = next(nodeid for unit in left.values() for nodeid, done in unit.items() if not done)
            for unit in left.values():
                if crashed in unit:
                    unit[crashed] = True
            left = {scope: unit for scope, unit in left.items() if not all(unit.values())}
            self.workqueue.update(left)
            for other in self.assigned_work:
                self._reschedule(other)
            return crashed

    return Groups


# A test whose own code runs a training loop: a trainer's ``train()`` or an optimizer's ``step()`` (so that a
# training test added later is slow without being listed).
TRAINS = re.compile(r"\btrainer\.train\(|\b(?:opt|optim|optimizer)\w*\.step\(\)")


def trains(function) -> bool:
    """Whether ``function``'s source runs a training loop (:data:`TRAINS`)."""
    try:
        return bool(TRAINS.search(inspect.getsource(function)))
    except (OSError, TypeError):
        return False


def is_slow(item) -> bool:
    """Whether ``item`` (a collected test) belongs to the full suite only."""
    stem = item.path.stem
    if stem in SLOW_MODULES or item.get_closest_marker("ray"):
        return True
    names = SLOW_TESTS.get(stem, set()) | TRAINING.get(stem, set())
    if getattr(item, "originalname", item.name) in names or item.name in names:
        return True
    return trains(getattr(item, "function", None))


def heavy_first(items) -> list:
    """``items`` (collected tests) in the order the suite runs them: the modules that are slow as a whole
    (:data:`SLOW_MODULES`), then the other modules with a slow test, then the rest (the ``vecpack/``
    doctests among them); collection order within each, every module's tests kept together (so that its
    module fixtures are built once per worker).

    Under ``--dist loadgroup`` each test is a unit of its own (but an ``xdist_group``, sent first) and a
    worker that runs out takes the next unit in this order: the longest tests start early, and the many
    short ones left at the end keep both workers busy until the last (in collection order, the training
    modules, ``test_tune_run``, ``test_trainers``, ``test_vision_trainer``, came last and one worker ran them
    alone for the last minutes)."""

    def rank(item) -> int:
        stem = item.path.stem
        if stem in SLOW_MODULES:
            return 0
        return 1 if stem in slow_modules else 2

    slow_modules = {item.path.stem for item in items if item.get_closest_marker("slow")}
    return sorted(items, key=rank)   # (stable: collection order within a rank)
