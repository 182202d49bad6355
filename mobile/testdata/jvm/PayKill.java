// The app of TestJVMPaymentSurvivesKill (jvm_test.go), written against the
// Java bindings that gobind generates for the package, as an Android app
// would use them.
//
//   java PayKill pay DIR URL     pays order 1 (and is killed before the answer)
//   java PayKill resume DIR URL  restarted: lists, resumes, pays again, checks errors
//
// Each step prints one line on stdout.

import idemretry.ActionList;
import idemretry.Client;
import idemretry.Failure;
import idemretry.Idemretry;
import idemretry.Outcome;
import idemretry.OutcomeList;
import idemretry.Rebuilder;
import idemretry.Request;
import idemretry.Response;
import java.nio.charset.StandardCharsets;

public class PayKill {
    static final String ACTION = "pay:order-jvm-1";

    static Request payment(String url, String actionID, int amount) {
        Request r = new Request("POST", url + "/charges");
        r.getHeaders().set("Content-Type", "application/json");
        r.setBody(("{\"amount\":" + amount + "}").getBytes(StandardCharsets.UTF_8));
        r.setActionID(actionID);
        return r;
    }

    public static void main(String[] args) throws Exception {
        String mode = args[0], dir = args[1], url = args[2];
        Client client = Idemretry.newClient(dir, null);
        if (mode.equals("pay")) {
            Response r = client.send(payment(url, ACTION, 1000));
            System.out.println("status " + r.getStatus());
        } else {
            ActionList pending = client.unfinished();
            for (int i = 0; i < pending.len(); i++) {
                System.out.println("unfinished " + pending.get(i).getActionID() + " " + pending.get(i).getKey());
            }
            OutcomeList outcomes = client.resume(new Rebuilder() {
                @Override
                public Request rebuild(String actionID) {
                    // The app looks the order up by its action id.
                    return payment(url, "", 1000);
                }
            });
            for (int i = 0; i < outcomes.len(); i++) {
                Outcome o = outcomes.get(i);
                if (o.getResponse() != null) {
                    System.out.println("resumed " + o.getActionID() + " " + o.getResponse().getStatus()
                            + " replayed=" + o.getResponse().getReplayed()
                            + " " + new String(o.getResponse().getBody(), StandardCharsets.UTF_8));
                } else {
                    System.out.println("not resumed " + o.getActionID() + " kind=" + o.getFailure().getKind());
                }
            }
            Response again = client.send(payment(url, ACTION, 1000));
            System.out.println("again " + again.getStatus() + " replayed=" + again.getReplayed());
            try {
                client.send(payment(url, ACTION, 1)); // another payload under the same id
                System.out.println("mismatch not refused");
            } catch (Exception e) {
                Failure f = Idemretry.failureOf(e);
                System.out.println("mismatch kind=" + Idemretry.errorKind(e)
                        + " isFingerprintMismatch=" + (f.getKind() == Idemretry.KindFingerprintMismatch)
                        + " action=" + f.getActionID());
            }
            client.sync();
        }
        client.close();
        try {
            client.sync();
        } catch (Exception e) {
            System.out.println("closed kind=" + Idemretry.errorKind(e) + " isClosed=" + (Idemretry.errorKind(e) == Idemretry.KindClosed));
        }
        System.out.flush();
        System.exit(0);
    }
}
