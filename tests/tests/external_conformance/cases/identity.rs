//! Conformance cases about message identity: the inbox, moved messages standing in for
//! their MessageId, future enqueues.

use super::*;

pub async fn the_inbox_skips_a_redelivered_message_id<H: Harness>() {
    let h = H::shared().await;
    let (_dir, host) = start(&h, "inbox = { store = \"sql\" }").await;
    let message = envelope_body(json!({"reply_to": "replies", "n": 1}), Some("dup-1"));
    h.produce_direct("export_order", &message).await;
    wait_for(T, "the first reply", || async {
        (replies(&host).await == vec![1]).then_some(())
    })
    .await;
    wait_empty(&h, "export_order").await;
    // The producer sends the same MessageId again, plus one without an id (no inbox).
    h.produce_direct("export_order", &message).await;
    h.produce_direct(
        "export_order",
        &envelope_body(json!({"reply_to": "replies", "n": 2}), None),
    )
    .await;
    wait_for(T, "the message without an id", || async {
        (replies(&host).await == vec![1, 2]).then_some(())
    })
    .await;
    wait_empty(&h, "export_order").await;
    assert_eq!(
        replies(&host).await,
        vec![1, 2],
        "the redelivery was skipped"
    );
    assert!(
        messages(&host, "export_order").await.is_empty(),
        "a duplicate is settled in the broker, not moved"
    );
    host.shutdown().await;
}

pub async fn a_moved_message_stands_in_for_its_message_id<H: Harness>() {
    let h = H::shared().await;
    let (_dir, host) = start(&h, "inbox = { store = \"sql\" }").await;
    // Fails on its broker delivery, moves into SQL, succeeds there on its second attempt.
    let message = envelope_body(
        json!({"transient_until": 2, "reply_to": "replies", "n": 1}),
        Some("m-1"),
    );
    h.produce_direct("export_order", &message).await;
    let moved = wait_for(T, "the moved message to succeed in SQL", || async {
        messages(&host, "export_order")
            .await
            .into_iter()
            .find(|m| m.status == Status::Processed)
    })
    .await;
    assert_eq!(moved.id.as_deref(), Some("m-1"));
    assert_eq!(replies(&host).await, vec![1]);
    // Its success recorded the broker MessageId: the broker sending it again is skipped.
    h.produce_direct("export_order", &message).await;
    wait_empty(&h, "export_order").await;
    // A moved message standing in for an already processed MessageId is skipped too.
    let stand_in = host
        .store
        .enqueue(
            "export_order",
            NewMessage {
                payload: json!({"reply_to": "replies", "n": 9}).to_string(),
                headers: vec![("wharf.provider".into(), "main".into())],
                source_delivery_id: Some("m-1".into()),
                ..NewMessage::default()
            },
            false,
        )
        .await
        .unwrap();
    host.router.wake(Some("export_order"));
    wait_for(T, "the stand-in to be skipped", || async {
        host.store
            .get(stand_in.key)
            .await
            .unwrap()
            .filter(|m| m.outcome.as_deref() == Some("skipped: duplicate"))
    })
    .await;
    assert_eq!(
        replies(&host).await,
        vec![1],
        "neither ran the handler again"
    );
    host.shutdown().await;
}

pub async fn a_future_enqueue_runs_when_due_and_once<H: Harness>() {
    let h = H::shared().await;
    let caps = capabilities(&h);
    let (_dir, host) = start(&h, "").await;
    let due = now_ms() + 1_500;
    host.router
        .enqueue(
            "export_order",
            NewMessage {
                id: Some("later-1".into()),
                payload: json!({"reply_to": "replies", "n": 1}).to_string(),
                process_at_ms: Some(due),
                ..NewMessage::default()
            },
        )
        .await
        .unwrap();
    let held = messages(&host, "export_order").await;
    if caps.delay {
        assert!(held.is_empty(), "the broker keeps it: {held:?}");
        assert_eq!(h.remaining("export_order").await, 1);
    } else {
        // Kept in SQL (sleeping) until due, then published by the host.
        assert_eq!(held.len(), 1, "{held:?}");
        assert_eq!(held[0].status, Status::Sleeping);
        assert_eq!(
            header(&held[0], "wharf.publish-to").as_deref(),
            Some("main")
        );
        assert_eq!(
            h.remaining("export_order").await,
            0,
            "not in the broker before its time"
        );
    }
    wait_for(T, "the reply", || async {
        (replies(&host).await == vec![1]).then_some(())
    })
    .await;
    assert!(now_ms() >= due - 1_000, "not long before its time");
    if !caps.delay {
        // The host published it into the broker (the broker's consumer ran it), not the guest
        // from SQL.
        let held = wait_for(T, "the held message to be completed", || async {
            messages(&host, "export_order")
                .await
                .into_iter()
                .find(|m| m.status == Status::Processed)
        })
        .await;
        assert_eq!(
            held.outcome.as_deref(),
            Some("published into provider `main`"),
            "{held:?}"
        );
    }
    wait_empty(&h, "export_order").await;
    // Give a second publication (there must be none) the chance to show up.
    host.router
        .enqueue("export_order", msg(json!({"reply_to": "replies", "n": 2})))
        .await
        .unwrap();
    wait_for(T, "the marker reply", || async {
        (replies(&host).await.contains(&2)).then_some(())
    })
    .await;
    assert_eq!(
        replies(&host).await,
        vec![1, 2],
        "published and processed once"
    );
    host.shutdown().await;
}
