//! Submit tokens: bound to a buyer and a SKU, one live per buyer, spent by the first decision
//! they take part in (a refusal too, never a replay), capped per window.

use super::*;

/// The token life cycle on a SKU that requires tokens: no token, no sale (and no stock moves);
/// a live token sells once; the same key replays, token or not; a new key with the spent token
/// is refused, and that refusal is stored like any decision.
pub async fn a_token_is_spent_by_its_first_decision(ledger: &dyn Ledger, tag: &str) {
    let sku = sku("token-once", tag);
    create_with_tokens(ledger, &sku, 10, 0).await;
    assert!(ledger.status(&sku).await.unwrap().require_token, "status reports the SKU requires tokens");
    let bare = ledger.confirm(&sku, &node("n1"), &[buy("none", "u1", 1)]).await.unwrap();
    assert_eq!(bare.verdicts, vec![Verdict::Fresh(Decision::TokenInvalid)], "no token, no sale");
    assert_eq!((bare.sold, bare.remaining), (0, 10), "a refused purchase moves no stock");

    let token = token(ledger, &sku, "u1").await;
    let first = ledger.confirm(&sku, &node("n1"), &[buy_with("k1", "u1", &token)]).await.unwrap();
    let Verdict::Fresh(decision @ Decision::Purchased(_)) = first.verdicts[0].clone() else {
        panic!("a live token of the buyer must sell: {first:?}")
    };
    let replay = ledger.confirm(&sku, &node("n2"), &[buy_with("k1", "u1", &token)]).await.unwrap();
    assert_eq!(replay.verdicts, vec![Verdict::Replayed(decision.clone())], "same key, spent token: a replay");
    let without = ledger.confirm(&sku, &node("n2"), &[buy("k1", "u1", 1)]).await.unwrap();
    assert_eq!(without.verdicts, vec![Verdict::Replayed(decision)], "the token is not part of the fingerprint");

    let again = ledger.confirm(&sku, &node("n1"), &[buy_with("k2", "u1", &token)]).await.unwrap();
    assert_eq!(again.verdicts, vec![Verdict::Fresh(Decision::TokenInvalid)], "a new key cannot reuse the token");
    let stored = ledger.confirm(&sku, &node("n1"), &[buy_with("k2", "u1", &token)]).await.unwrap();
    assert_eq!(stored.verdicts, vec![Verdict::Replayed(Decision::TokenInvalid)], "the refusal replays");
    // Two keys with one token in one batch: the first spends it.
    let fresh = self::token(ledger, &sku, "u2").await;
    let batch =
        ledger.confirm(&sku, &node("n1"), &[buy_with("b1", "u2", &fresh), buy_with("b2", "u2", &fresh)]).await.unwrap();
    assert!(is_purchased(&batch.verdicts[0]), "{:?}", batch.verdicts);
    assert_eq!(batch.verdicts[1], Verdict::Fresh(Decision::TokenInvalid));
    assert_eq!(ledger.status(&sku).await.unwrap().sold, 2, "one sale per token");
}

/// A token works only for the user it was issued to and only on its SKU. A token presented by
/// someone else is refused and stays its owner's: a buyer holds one live token per SKU, so
/// spending it there would leave the owner handed a dead token until it expired, and anyone who
/// learned it could lock the owner out. Tokens are 128 random bits, so guessing one is hopeless.
pub async fn a_token_binds_its_user_and_its_sku(ledger: &dyn Ledger, tag: &str) {
    let (x, y) = (sku("token-x", tag), sku("token-y", tag));
    create_with_tokens(ledger, &x, 10, 0).await;
    create_with_tokens(ledger, &y, 10, 0).await;
    let alice = token(ledger, &x, "alice").await;
    let other_sku = ledger.confirm(&y, &node("n1"), &[buy_with("k1", "alice", &alice)]).await.unwrap();
    assert_eq!(other_sku.verdicts, vec![Verdict::Fresh(Decision::TokenInvalid)], "a token of X on Y");
    let other_user = ledger.confirm(&x, &node("n1"), &[buy_with("k2", "bob", &alice)]).await.unwrap();
    assert_eq!(other_user.verdicts, vec![Verdict::Fresh(Decision::TokenInvalid)], "alice's token used by bob");
    let own = self::token(ledger, &x, "alice").await;
    assert_eq!(own, alice, "neither attempt took alice's token from her");
    let bought = ledger.confirm(&x, &node("n1"), &[buy_with("k3", "alice", &own)]).await.unwrap();
    assert!(is_purchased(&bought.verdicts[0]), "{bought:?}");
    assert_eq!((ledger.status(&x).await.unwrap().sold, ledger.status(&y).await.unwrap().sold), (1, 0));
    let missing = ledger.issue_token(&sku("token-absent", tag), &user("alice"), Duration::from_secs(60)).await;
    assert!(matches!(missing, Err(LedgerError::Missing(_))), "no token for a SKU the ledger lacks: {missing:?}");
    assert!(matches!(ledger.status(&sku("token-absent", tag)).await, Err(LedgerError::Missing(_))));
}

/// A buyer holds at most one live token per SKU: asking again gives back the token the buyer
/// holds (so a client inventing asks cannot stockpile tokens under one user) until a purchase
/// spends it or it expires; then the next ask gets a fresh one. Another buyer gets their own.
pub async fn a_buyer_holds_one_live_token_per_sku(ledger: &dyn Ledger, tag: &str) {
    let sku = sku("token-held", tag);
    create_with_tokens(ledger, &sku, 10, 0).await;
    let ttl = Duration::from_secs(60);
    let issued = ledger.issue_token(&sku, &user("alice"), ttl).await.unwrap();
    assert_eq!(issued.expires_in, ttl, "a fresh token lives its whole TTL");
    let first = issued.token;
    tokio::time::sleep(Duration::from_millis(20)).await;
    let again = ledger.issue_token(&sku, &user("alice"), ttl).await.unwrap();
    assert_eq!(again.token, first, "the same buyer asking again gets the same token");
    assert!(
        again.expires_in < ttl && again.expires_in > ttl - Duration::from_secs(5),
        "a held token comes with what is left of its life: {:?}",
        again.expires_in
    );
    let bob = token(ledger, &sku, "bob").await;
    assert_ne!(bob, first, "another buyer gets a token of their own");
    assert_eq!(token(ledger, &sku, "bob").await, bob);

    let bought = ledger.confirm(&sku, &node("n1"), &[buy_with("k1", "alice", &first)]).await.unwrap();
    assert!(is_purchased(&bought.verdicts[0]), "{bought:?}");
    let second = token(ledger, &sku, "alice").await;
    assert_ne!(second, first, "once a purchase spent it, the next ask is a fresh token");
    assert_eq!(token(ledger, &sku, "alice").await, second, "which the buyer then holds");
    let bought = ledger.confirm(&sku, &node("n1"), &[buy_with("k2", "alice", &second)]).await.unwrap();
    assert!(is_purchased(&bought.verdicts[0]), "the fresh token sells: {bought:?}");

    // A refused purchase spends the token too, and frees the buyer to ask again.
    let limited = self::sku("token-held-limit", tag);
    create_with_tokens(ledger, &limited, 10, 1).await;
    let once = token(ledger, &limited, "carol").await;
    let sold = ledger.confirm(&limited, &node("n1"), &[buy_with("c1", "carol", &once)]).await.unwrap();
    assert!(is_purchased(&sold.verdicts[0]), "{sold:?}");
    let twice = token(ledger, &limited, "carol").await;
    let refused = ledger.confirm(&limited, &node("n1"), &[buy_with("c2", "carol", &twice)]).await.unwrap();
    assert_eq!(refused.verdicts, vec![Verdict::Fresh(Decision::UserLimit)]);
    assert_ne!(token(ledger, &limited, "carol").await, twice, "the refused attempt spent the held token");

    let brief = self::sku("token-held-ttl", tag);
    create_with_tokens(ledger, &brief, 10, 0).await;
    let short = ledger.issue_token(&brief, &user("dave"), Duration::from_millis(100)).await.unwrap().token;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let after = ledger.issue_token(&brief, &user("dave"), Duration::from_millis(100)).await.unwrap().token;
    assert_ne!(after, short, "once the held token expired, the next ask is a fresh one");
}

/// A buyer's repeated asks take one slot of the SKU's per-window cap: the cap bounds memory,
/// and a held token costs none more. Method: on a ledger built with `token_issue_max = cap`, one
/// buyer asks 1,000 times, then `cap - 1` other buyers get theirs and the next is refused.
/// The windows are one TTL long and aligned to the clock, so a check that straddles two windows
/// is run again on a fresh SKU.
pub async fn a_buyers_asks_take_one_slot_of_the_token_cap(ledger: &dyn Ledger, tag: &str, cap: u64) {
    assert!(cap >= 2, "the check needs room for the buyer and one other");
    let ttl = Duration::from_secs(3600);
    for attempt in 0..3 {
        let window = crate::token_window(crate::unix_ms(), ttl).0;
        let sku = sku(&format!("token-cap-{attempt}"), tag);
        create_with_tokens(ledger, &sku, 10, 0).await;
        let held = ledger.issue_token(&sku, &user("alice"), ttl).await.unwrap().token;
        for _ in 0..999 {
            assert_eq!(ledger.issue_token(&sku, &user("alice"), ttl).await.unwrap().token, held);
        }
        for other in 1..cap {
            let issued = ledger.issue_token(&sku, &user(&format!("u{other}")), ttl).await;
            assert!(issued.is_ok(), "buyer {other} of a cap of {cap}: {issued:?}");
        }
        let over = ledger.issue_token(&sku, &user("over"), ttl).await;
        if crate::token_window(crate::unix_ms(), ttl).0 != window {
            continue;
        }
        assert!(matches!(over, Err(LedgerError::TokensExhausted { .. })), "the cap holds past it: {over:?}");
        assert_eq!(
            ledger.issue_token(&sku, &user("alice"), ttl).await.unwrap().token,
            held,
            "a buyer who holds a token gets it back even once the window's tokens are all issued"
        );
        return;
    }
    panic!("three attempts each straddled two token windows");
}

/// A token past its TTL sells nothing. Waits in real time: both ledgers expire by their own
/// clock (Redis by its key expiry), which a test cannot pause.
pub async fn an_expired_token_is_refused(ledger: &dyn Ledger, tag: &str) {
    let sku = sku("token-ttl", tag);
    create_with_tokens(ledger, &sku, 10, 0).await;
    let token = ledger.issue_token(&sku, &user("u1"), Duration::from_millis(100)).await.unwrap().token;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let late = ledger.confirm(&sku, &node("n1"), &[buy_with("k", "u1", &token)]).await.unwrap();
    assert_eq!(late.verdicts, vec![Verdict::Fresh(Decision::TokenInvalid)]);
    assert_eq!(late.sold, 0);
}

/// One token, one attempt: a purchase refused for its limit or for stock still spends its
/// token, so a buyer cannot keep one token and retry it under new keys until stock appears.
pub async fn a_refused_purchase_spends_its_token_too(ledger: &dyn Ledger, tag: &str) {
    let sku = sku("token-refused", tag);
    create_with_tokens(ledger, &sku, 1, 0).await;
    let first = token(ledger, &sku, "u1").await;
    let sold = ledger.confirm(&sku, &node("n1"), &[buy_with("k1", "u1", &first)]).await.unwrap();
    assert!(is_purchased(&sold.verdicts[0]));
    let second = token(ledger, &sku, "u2").await;
    let refused = ledger.confirm(&sku, &node("n1"), &[buy_with("k2", "u2", &second)]).await.unwrap();
    assert_eq!(refused.verdicts, vec![Verdict::Fresh(Decision::SoldOut)], "a live token does not create stock");
    ledger.restock_to(&sku, 2).await.unwrap();
    let retried = ledger.confirm(&sku, &node("n1"), &[buy_with("k3", "u2", &second)]).await.unwrap();
    assert_eq!(retried.verdicts, vec![Verdict::Fresh(Decision::TokenInvalid)], "the sold_out attempt spent it");
}

/// A SKU that does not require tokens sells as it always did: with no token, and without
/// reading or spending a token that comes along.
pub async fn skus_without_tokens_ignore_them(ledger: &dyn Ledger, tag: &str) {
    let (open, guarded) = (sku("token-free", tag), sku("token-guarded", tag));
    create(ledger, &open, 10, 0).await;
    create_with_tokens(ledger, &guarded, 10, 0).await;
    assert!(!ledger.status(&open).await.unwrap().require_token);
    let bare = ledger.confirm(&open, &node("n1"), &[buy("k1", "u1", 1)]).await.unwrap();
    assert!(is_purchased(&bare.verdicts[0]), "{bare:?}");
    let issued = token(ledger, &open, "u1").await;
    let twice = [buy_with("k2", "u1", &issued), buy_with("k3", "u1", &issued)];
    let with = ledger.confirm(&open, &node("n1"), &twice).await.unwrap();
    assert!(with.verdicts.iter().all(is_purchased), "the token is neither needed nor spent: {with:?}");
    let unknown = SubmitToken::new("0123456789abcdef0123456789abcdef").expect("valid token");
    let made_up = ledger.confirm(&open, &node("n1"), &[buy_with("k4", "u1", &unknown)]).await.unwrap();
    assert!(is_purchased(&made_up.verdicts[0]), "a token that was never issued is not read either");
    let on_guarded = ledger.confirm(&guarded, &node("n1"), &[buy_with("k5", "u1", &issued)]).await.unwrap();
    assert_eq!(on_guarded.verdicts, vec![Verdict::Fresh(Decision::TokenInvalid)], "tokens are per SKU");
}

/// Goal: one token sells at most once however many purchases race with it. Method: 8 tasks
/// confirm concurrently, each under its own key with the same token; exactly one sells.
pub async fn one_token_sells_once_under_concurrency(ledger: Arc<dyn Ledger>, tag: &str) {
    let sku = sku("token-race", tag);
    create_with_tokens(&*ledger, &sku, 100, 0).await;
    let token = token(&*ledger, &sku, "u1").await;
    let tasks: Vec<_> = (0..8)
        .map(|n| {
            let (ledger, sku, token) = (ledger.clone(), sku.clone(), token.clone());
            tokio::spawn(async move {
                let outcome =
                    ledger.confirm(&sku, &node(&format!("n{n}")), &[buy_with(&format!("k{n}"), "u1", &token)]).await;
                outcome.unwrap().verdicts.remove(0)
            })
        })
        .collect();
    let mut verdicts = Vec::new();
    for task in tasks {
        verdicts.push(task.await.expect("confirm task panicked"));
    }
    assert_eq!(verdicts.iter().filter(|v| is_purchased(v)).count(), 1, "{verdicts:?}");
    assert_eq!(verdicts.iter().filter(|v| **v == Verdict::Fresh(Decision::TokenInvalid)).count(), 7);
    assert_eq!(ledger.status(&sku).await.unwrap().sold, 1);
}

/// Goal: a replay never touches a token, even when a fresh purchase in the same batch presents
/// the same one, and a purchase without a token in a batch of token purchases is refused alone.
/// Method: a key sold with one token is retried with a second token of the same buyer, next to
/// a fresh key with that second token and a fresh key without any.
pub async fn a_replay_in_a_batch_leaves_the_token_to_a_fresh_purchase(ledger: &dyn Ledger, tag: &str) {
    let sku = sku("batch-token", tag);
    create_with_tokens(ledger, &sku, 10, 0).await;
    let first = token(ledger, &sku, "u1").await;
    let sold = ledger.confirm(&sku, &node("n1"), &[buy_with("k1", "u1", &first)]).await.unwrap();
    let Verdict::Fresh(sold_k1) = sold.verdicts[0].clone() else { panic!("fresh: {sold:?}") };
    let second = token(ledger, &sku, "u1").await;
    let batch = [buy_with("k1", "u1", &second), buy_with("k2", "u1", &second), buy("k3", "u1", 1), buy("k2", "u1", 1)];
    let outcome = ledger.confirm(&sku, &node("n1"), &batch).await.unwrap();
    assert_eq!(outcome.verdicts[0], Verdict::Replayed(sold_k1), "the retry replays");
    let Verdict::Fresh(sold_k2 @ Decision::Purchased(_)) = outcome.verdicts[1].clone() else {
        panic!("the replay left the token live: {:?}", outcome.verdicts)
    };
    assert_eq!(outcome.verdicts[2], Verdict::Fresh(Decision::TokenInvalid), "no token, no sale");
    assert_eq!(outcome.verdicts[3], Verdict::Replayed(sold_k2), "a repeat without the token replays");
    assert_eq!((outcome.sold, outcome.remaining), (2, 8));
}
